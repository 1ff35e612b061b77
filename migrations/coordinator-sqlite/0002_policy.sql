-- A SKU's own policy, as migrations/coordinator/0002_policy.sql adds it on
-- PostgreSQL: its name and all of its settings as JSON text, both or
-- neither; neither runs the coordinator's --policy. SQLite adds a column
-- at a time and cannot add a table constraint to an existing table, so the
-- both-or-neither rule is a CHECK on the second column, which sees the
-- first.
ALTER TABLE skus ADD COLUMN policy TEXT
    CHECK (policy IN ('static', 'refill', 'proportional', 'tail-merge', 'central'));
ALTER TABLE skus ADD COLUMN policy_settings TEXT
    CONSTRAINT skus_policy_whole CHECK ((policy IS NULL) = (policy_settings IS NULL));
