-- The per-user limit across regions (docs/protocol.md, "Per-user limit
-- across regions"); PostgreSQL's 0005 says why each part is there.

ALTER TABLE sku_stock ADD COLUMN user_limit_scope TEXT NOT NULL DEFAULT 'region'
    CHECK (user_limit_scope IN ('region', 'global'));

-- SQLite cannot change a CHECK constraint: the table is rebuilt with LENT
-- and RETURNED among the statuses.
CREATE TABLE reservations_new (
    tenant       TEXT NOT NULL,
    request_key  TEXT NOT NULL,
    sku          TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    qty          INTEGER NOT NULL CHECK (qty >= 1),
    status       TEXT NOT NULL
                 CHECK (status IN ('HELD', 'SOLD', 'RELEASED', 'EXPIRED', 'LENT', 'RETURNED')),
    expires_at   INTEGER NOT NULL,
    extended     INTEGER NOT NULL DEFAULT 0 CHECK (extended IN (0, 1)),
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant, request_key)
) STRICT;

INSERT INTO reservations_new SELECT * FROM reservations;
DROP TABLE reservations;
ALTER TABLE reservations_new RENAME TO reservations;

CREATE UNIQUE INDEX reservations_one_active_per_user
    ON reservations (tenant, sku, user_id)
    WHERE status IN ('HELD', 'SOLD', 'LENT');

CREATE INDEX reservations_held_by_expiry
    ON reservations (tenant, sku, expires_at)
    WHERE status = 'HELD';

CREATE TABLE borrows (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    sku          TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    request_key  TEXT NOT NULL,
    home         TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('ASKED', 'USED', 'RETURN')),
    created_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
) STRICT;

CREATE INDEX borrows_by_state ON borrows (state);
