-- The coordinator's database on SQLite: the schema that
-- migrations/coordinator/0001_init.sql builds on PostgreSQL, with the same
-- meaning. Every rule the books rely on is a constraint here too (counts
-- never negative, pool <= total, one row per transfer id, a return always
-- DELIVERED, transfers only to a region of their SKU), so a bug in the
-- coordinator fails a statement instead of creating or destroying a unit.
--
-- Differences of form only, as in migrations/region-agent-sqlite/: tables
-- are STRICT (a value of the wrong type is refused, as PostgreSQL's typed
-- columns refuse it); times are INTEGER milliseconds since the epoch;
-- booleans are INTEGER 0/1 with a CHECK; an `integer` column keeps
-- PostgreSQL's 32-bit range with a CHECK; the region-name regex is a length
-- and GLOB check; primary key columns are declared NOT NULL (SQLite would
-- otherwise let a NULL through). Foreign keys are enforced because every
-- connection is opened with foreign_keys=ON (service_kit::db).

CREATE TABLE skus (
    tenant        TEXT NOT NULL,
    sku           TEXT NOT NULL,
    total         INTEGER NOT NULL CHECK (total >= 0),
    pool          INTEGER NOT NULL CHECK (pool >= 0),
    mode          TEXT NOT NULL DEFAULT 'ESCROW' CHECK (mode IN ('ESCROW', 'CENTRAL')),
    paused        INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    max_per_user  INTEGER NOT NULL CHECK (max_per_user BETWEEN 1 AND 1000),
    hold_ttl_ms   INTEGER NOT NULL CHECK (hold_ttl_ms BETWEEN 1000 AND 3600000),
    created_at    INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    updated_at    INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    PRIMARY KEY (tenant, sku),
    CHECK (pool <= total)
) STRICT;

-- One region's share of one SKU, and its last report.
CREATE TABLE sku_regions (
    tenant              TEXT NOT NULL,
    sku                 TEXT NOT NULL,
    region              TEXT NOT NULL
                        CHECK (length(region) BETWEEN 1 AND 32 AND region NOT GLOB '*[^a-z0-9-]*'),
    weight              INTEGER NOT NULL CHECK (weight BETWEEN 0 AND 2147483647),
    leased              INTEGER NOT NULL DEFAULT 0 CHECK (leased >= 0),
    returned            INTEGER NOT NULL DEFAULT 0 CHECK (returned >= 0),
    recall_pending      INTEGER NOT NULL DEFAULT 0 CHECK (recall_pending >= 0),
    reported_available  INTEGER NOT NULL DEFAULT 0 CHECK (reported_available >= 0),
    reported_held       INTEGER NOT NULL DEFAULT 0 CHECK (reported_held >= 0),
    reported_sold       INTEGER NOT NULL DEFAULT 0 CHECK (reported_sold >= 0),
    sale_rate_per_s     REAL NOT NULL DEFAULT 0,
    reported_at         INTEGER,
    PRIMARY KEY (tenant, sku, region),
    FOREIGN KEY (tenant, sku) REFERENCES skus (tenant, sku)
) STRICT;

-- Grants (pool -> region) and returns (region -> pool). A grant is PENDING
-- from the pool's debit until the region acknowledges it; a return is
-- recorded DELIVERED when applied. The primary key makes every transfer
-- apply once.
CREATE TABLE transfers (
    id            TEXT NOT NULL PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    tenant        TEXT NOT NULL,
    sku           TEXT NOT NULL,
    region        TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('GRANT', 'RETURN')),
    units         INTEGER NOT NULL CHECK (units > 0),
    state         TEXT NOT NULL CHECK (state IN ('PENDING', 'DELIVERED')),
    created_at    INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    delivered_at  INTEGER,
    FOREIGN KEY (tenant, sku, region) REFERENCES sku_regions (tenant, sku, region),
    CHECK (kind = 'GRANT' OR state = 'DELIVERED')
) STRICT;

-- SQLite uses a partial index only for a query that repeats its condition,
-- as the pending-grant reads do (`state = 'PENDING'`).
CREATE INDEX transfers_pending ON transfers (region, tenant, sku) WHERE state = 'PENDING';

-- Each region agent's last sync: its epoch orders processes, seq orders
-- reports within one process.
CREATE TABLE regions (
    region        TEXT NOT NULL PRIMARY KEY
                  CHECK (length(region) BETWEEN 1 AND 32 AND region NOT GLOB '*[^a-z0-9-]*'),
    epoch         INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    rtt_ms        INTEGER NOT NULL DEFAULT 0,
    last_sync_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
) STRICT;
