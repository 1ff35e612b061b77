-- Carts, as migrations/region-agent/0004_carts.sql builds them on
-- PostgreSQL: several SKUs held together under one request key, all or
-- nothing. Items are reservation rows keyed '{cart key}/{sku}'; this row is
-- the cart's one status and expiry, moved in the same transaction as its
-- items' rows and counters.
CREATE TABLE carts (
    tenant       TEXT NOT NULL,
    request_key  TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    items        INTEGER NOT NULL CHECK (items BETWEEN 1 AND 20),
    status       TEXT NOT NULL CHECK (status IN ('HELD', 'SOLD', 'RELEASED', 'EXPIRED')),
    expires_at   INTEGER NOT NULL,
    extended     INTEGER NOT NULL DEFAULT 0 CHECK (extended IN (0, 1)),
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant, request_key)
) STRICT;

CREATE INDEX carts_held_by_expiry ON carts (expires_at) WHERE status = 'HELD';
