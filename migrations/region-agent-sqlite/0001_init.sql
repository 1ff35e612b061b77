-- The region agent's own database on SQLite: the schema that
-- migrations/region-agent/0001..0003 build on PostgreSQL, with the same
-- meaning. Every invariant the agent relies on is a constraint here too, so
-- a bug in the agent fails a statement instead of overselling.
--
-- Differences of form only: tables are STRICT (a value of the wrong type
-- is refused, as PostgreSQL's typed columns refuse it); times are INTEGER
-- milliseconds since the epoch (the agent's clock, as on PostgreSQL the
-- commit compares with the batch's now and never the database's clock);
-- booleans are INTEGER 0/1 with a CHECK; text compares bytewise (BINARY),
-- as the "C" collation of 0003 does.

-- Fencing: the agent serving this region takes a new epoch at start and
-- every write transaction (BEGIN IMMEDIATE, which SQLite serialises)
-- checks it first; an older agent finds no row and stops writing.
CREATE TABLE region_lease (
    region     TEXT PRIMARY KEY
               CHECK (length(region) BETWEEN 1 AND 32 AND region NOT GLOB '*[^a-z0-9-]*'),
    epoch      INTEGER NOT NULL CHECK (epoch > 0),
    taken_at   INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
) STRICT;

-- Per-SKU counters: the region's ledger.
CREATE TABLE sku_stock (
    tenant        TEXT NOT NULL,
    sku           TEXT NOT NULL,
    available     INTEGER NOT NULL CHECK (available >= 0),
    held          INTEGER NOT NULL CHECK (held >= 0),
    sold          INTEGER NOT NULL CHECK (sold >= 0),
    received      INTEGER NOT NULL CHECK (received >= 0),
    returned      INTEGER NOT NULL CHECK (returned >= 0),
    max_per_user  INTEGER NOT NULL CHECK (max_per_user BETWEEN 1 AND 1000),
    hold_ttl_ms   INTEGER NOT NULL CHECK (hold_ttl_ms BETWEEN 1000 AND 3600000),
    paused        INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    mode          TEXT NOT NULL DEFAULT 'ESCROW' CHECK (mode IN ('ESCROW', 'CENTRAL')),
    updated_at    INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    PRIMARY KEY (tenant, sku),
    CONSTRAINT sku_stock_balanced CHECK (available + held + sold = received - returned)
) STRICT;

-- One row per reservation, keyed by the buyer's request key. No foreign key
-- to sku_stock (0003 dropped it on PostgreSQL): a batch that inserts holds
-- also updates its SKU's counter row and fails unless exactly one changed.
CREATE TABLE reservations (
    tenant       TEXT NOT NULL,
    request_key  TEXT NOT NULL,
    sku          TEXT NOT NULL,
    user_id      TEXT NOT NULL,
    qty          INTEGER NOT NULL CHECK (qty >= 1),
    status       TEXT NOT NULL CHECK (status IN ('HELD', 'SOLD', 'RELEASED', 'EXPIRED')),
    expires_at   INTEGER NOT NULL,
    extended     INTEGER NOT NULL DEFAULT 0 CHECK (extended IN (0, 1)),
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (tenant, request_key)
) STRICT;

-- One active (HELD or SOLD) reservation per user and SKU.
CREATE UNIQUE INDEX reservations_one_active_per_user
    ON reservations (tenant, sku, user_id)
    WHERE status IN ('HELD', 'SOLD');

-- The expiry sweep reads only due holds.
CREATE INDEX reservations_held_by_expiry
    ON reservations (tenant, sku, expires_at)
    WHERE status = 'HELD';

-- Coordinator mode: quota arrives as grants and leaves as returns, each
-- with an id. A grant is credited once (the primary key here); a return is
-- debited together with its outbox row and deleted once the coordinator
-- confirms it applied it.
CREATE TABLE applied_grants (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    sku         TEXT NOT NULL,
    units       INTEGER NOT NULL CHECK (units > 0),
    applied_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    confirmed   INTEGER NOT NULL DEFAULT 0 CHECK (confirmed IN (0, 1)),
    FOREIGN KEY (tenant, sku) REFERENCES sku_stock (tenant, sku)
) STRICT;

CREATE INDEX applied_grants_unconfirmed ON applied_grants (id) WHERE NOT confirmed;

CREATE TABLE outbox_returns (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    sku         TEXT NOT NULL,
    units       INTEGER NOT NULL CHECK (units > 0),
    created_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    FOREIGN KEY (tenant, sku) REFERENCES sku_stock (tenant, sku)
) STRICT;
