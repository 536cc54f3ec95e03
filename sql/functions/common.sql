-- sql/functions/common.sql — the current definition of every common function, view and trigger.
-- Helpers every lifecycle uses (refuse_change for immutable rows).
--
-- Repeatable file (ADR 0012): `tuneplane db migrate` re-applies every file of sql/functions/ (in the order
-- of order.txt, one transaction) whenever one changes. Edit definitions here, never in a migration.
-- Tables, columns and data changes go in a new numbered migration. A changed signature or a view whose
-- columns change: add its DROP below (it runs before the new definition is created), e.g.
--   DROP FUNCTION IF EXISTS tuneplane.f(bigint, text);
--
-- Drops (signature changes):

-- A reusable guard for tables whose rows never change once written (previews, decisions, manifests).
CREATE OR REPLACE FUNCTION tuneplane.refuse_change() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are immutable', TG_TABLE_NAME USING ERRCODE = 'TP409';
END;
$$;

-- jsonb_whole_number: a JSON value as a number when it is a whole JSON number from 0 to p_max, else NULL (a
-- string, a fraction, a negative or too large number, an absent key). For checks of what agents report:
-- jsonb_typeof(x) <> 'number' is NULL, not true, when the key is absent, and lets it through.
CREATE OR REPLACE FUNCTION tuneplane.jsonb_whole_number(p_value jsonb, p_max numeric)
RETURNS numeric
LANGUAGE sql IMMUTABLE AS $$
    SELECT v FROM (SELECT CASE WHEN jsonb_typeof(p_value) = 'number' THEN (p_value::text)::numeric END AS v) x
     WHERE v >= 0 AND v <= p_max AND v = trunc(v);
$$;
