-- 0001 foundation: the tuneplane schema and the migration bookkeeping.
-- Every later migration adds its own tables and functions in its own numbered file; a landed file is
-- never edited (the migrator compares checksums and refuses a changed file).

CREATE SCHEMA IF NOT EXISTS tuneplane;

CREATE TABLE tuneplane.schema_migrations (
    version     integer PRIMARY KEY,
    name        text        NOT NULL,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- Components whose schema someone else writes (pgqueuer): the version we installed and the SQL's digest.
CREATE TABLE tuneplane.schema_components (
    name        text PRIMARY KEY,
    version     text        NOT NULL,
    checksum    text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- A reusable guard for tables whose rows never change once written (previews, decisions, manifests).
CREATE FUNCTION tuneplane.refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = 'TP409';
END;
$$;
