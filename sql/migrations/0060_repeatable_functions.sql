-- 0060 repeatable function files: from here on the current definition of every function, view and trigger
-- lives once, in sql/functions/<lifecycle>.sql, and `tuneplane db migrate` re-applies those files (all of
-- them, in the order of sql/functions/order.txt, in one transaction) whenever one of their checksums
-- changes. This table records what was applied (ADR 0012).
CREATE TABLE tuneplane.schema_repeatables (
    name       text PRIMARY KEY,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);
