"""Artifacts on the server side: receiving chunked uploads, verifying bytes against manifests, reading
artifact files back for downloads and verification (object blobs or a fleet's shared mount)."""
