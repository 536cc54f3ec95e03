"""`tuneplane blobs gc`: the operator's blob garbage collection (the backend worker also runs it on a
schedule). Talks to the database and the blob store directly, like `tuneplane db`."""

from __future__ import annotations

import click

from tuneplane.app.cli.options import database, json_option, print_json, server_side, settings_from


@click.group("blobs")
def blobs_group() -> None:
    """The server's content-addressed blob store (artifact files, source archives, capsules)."""


@blobs_group.command("gc")
@click.option(
    "--min-age",
    type=click.FloatRange(min=0),
    default=3600.0,
    show_default=True,
    help="Keep unreferenced blobs younger than this many seconds (uploads that are not recorded yet).",
)
@click.option("--dry-run", is_flag=True, help="Only report what would be removed.")
@server_side
@json_option
def gc_cmd(
    min_age: float, dry_run: bool, database_url: str | None, data_dir: str | None, as_json: bool
) -> None:
    """Remove blobs that no artifact, source archive or capsule needs (blob_references() in the database)."""
    from tuneplane.app.artifacts.gc import collect
    from tuneplane.app.artifacts.s3_gc import collect_fleet_stores
    from tuneplane.app.db import Database

    settings = settings_from(database_url, data_dir)
    with database(settings) as url:
        db = Database(url, max_size=1, name="tuneplane-blob-gc")
        try:
            report = collect(db, settings.blob_dir, min_age=min_age, dry_run=dry_run)
            # The fleets' S3 stores too (app/artifacts/s3_gc.py), with this server's credentials.
            s3_reports = collect_fleet_stores(db, min_age=min_age, dry_run=dry_run)
        finally:
            db.close()
    failed = [r for r in s3_reports if r.error]
    if as_json:
        print_json({**report.as_json(), "s3": [r.as_json() for r in s3_reports]})
        if failed:
            raise click.exceptions.Exit(1)
        return
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{report.examined} blob(s) examined: {verb} {len(report.removed)} ({report.removed_bytes} bytes); "
        f"kept {report.kept_referenced} referenced and {report.kept_recent} younger than {min_age:.0f}s"
    )
    click.echo(
        f"left behind by ended uploads (staged files of artifacts no longer uploading, stale temp files): "
        f"{verb} {report.removed_leftovers} ({report.leftover_bytes} bytes)"
    )

    for s3 in s3_reports:
        if s3.error:
            click.echo(f"{s3.store}: not collected: {s3.error}", err=True)
            continue
        click.echo(
            f"{s3.store}: {s3.examined} object(s) examined: {verb} {len(s3.removed)} blob(s) and "
            f"{s3.removed_objects} artifact object(s) ({s3.removed_bytes} bytes), kept "
            f"{s3.kept_referenced} referenced, {s3.kept_recent} recent and {s3.kept_uploading} of "
            f"uploading artifacts; multipart uploads of ended artifacts "
            f"{'would abort' if dry_run else 'aborted'} {s3.aborted_uploads}"
        )
    if failed:
        raise click.ClickException(
            f"{len(failed)} S3 store(s) not collected (above): check the endpoint, bucket and the server's "
            "credentials a fleet names (`tuneplane fleet show NAME`); the others were collected"
        )


COMMANDS = [blobs_group]
