-- A SKU's own policy: its name and all of its settings as JSON text, both
-- or neither; neither runs the coordinator's --policy.
ALTER TABLE skus
    ADD COLUMN policy text
        CHECK (policy IN ('static', 'refill', 'proportional', 'tail-merge', 'central')),
    ADD COLUMN policy_settings text,
    ADD CONSTRAINT skus_policy_whole CHECK ((policy IS NULL) = (policy_settings IS NULL));
