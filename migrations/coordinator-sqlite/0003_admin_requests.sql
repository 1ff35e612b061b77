-- Admin changes sent with an Idempotency-Key, as
-- migrations/coordinator/0003_admin_requests.sql on PostgreSQL; times are
-- ms since the epoch.
CREATE TABLE admin_requests (
    key         TEXT PRIMARY KEY CHECK (length(key) BETWEEN 1 AND 128),
    operation   TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);
