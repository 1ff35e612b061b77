-- Admin changes sent with an Idempotency-Key: the key is recorded in the
-- change's own transaction, so a retried request (timeout, proxy retry)
-- finds it and is not applied twice; `operation` is what the key asked
-- for, so a key reused for another change is refused.
CREATE TABLE admin_requests (
    key         text PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 128),
    operation   text NOT NULL,
    created_at  timestamptz NOT NULL
);
