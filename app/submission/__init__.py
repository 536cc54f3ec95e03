"""Submission: a JobSpec (intent) → an immutable preview (resolution) → a confirmation (one job).

Python validates the JobSpec and pins what only it can see (integration files, Python environment, image
reference); the stored functions create_preview and confirm_preview decide everything else.
"""
