-- The region agent's own database: one region's stock and its reservations.
-- Every invariant the agent relies on is also a constraint here, so a bug in
-- the agent fails a statement instead of overselling.

-- Fencing: the agent serving this region takes a new epoch at start and every
-- write transaction locks this row FOR SHARE with its epoch; an older agent
-- finds no row and stops writing.
CREATE TABLE region_lease (
    region     text PRIMARY KEY CHECK (region ~ '^[a-z0-9-]{1,32}$'),
    epoch      bigint NOT NULL CHECK (epoch > 0),
    taken_at   timestamptz NOT NULL DEFAULT now()
);

-- Per-SKU counters: the region's ledger.
CREATE TABLE sku_stock (
    tenant        text NOT NULL,
    sku           text NOT NULL,
    available     bigint NOT NULL CHECK (available >= 0),
    held          bigint NOT NULL CHECK (held >= 0),
    sold          bigint NOT NULL CHECK (sold >= 0),
    received      bigint NOT NULL CHECK (received >= 0),
    returned      bigint NOT NULL CHECK (returned >= 0),
    max_per_user  integer NOT NULL CHECK (max_per_user BETWEEN 1 AND 1000),
    hold_ttl_ms   bigint NOT NULL CHECK (hold_ttl_ms BETWEEN 1000 AND 3600000),
    paused        boolean NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, sku),
    CONSTRAINT sku_stock_balanced CHECK (available + held + sold = received - returned)
);

-- One row per reservation, keyed by the buyer's request key.
CREATE TABLE reservations (
    tenant       text NOT NULL,
    request_key  text NOT NULL,
    sku          text NOT NULL,
    user_id      text NOT NULL,
    qty          integer NOT NULL CHECK (qty >= 1),
    status       text NOT NULL CHECK (status IN ('HELD', 'SOLD', 'RELEASED', 'EXPIRED')),
    expires_at   timestamptz NOT NULL,
    extended     boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant, request_key),
    FOREIGN KEY (tenant, sku) REFERENCES sku_stock (tenant, sku)
);

-- One active (HELD or SOLD) reservation per user and SKU.
CREATE UNIQUE INDEX reservations_one_active_per_user
    ON reservations (tenant, sku, user_id)
    WHERE status IN ('HELD', 'SOLD');

-- The expiry sweep reads only due holds.
CREATE INDEX reservations_held_by_expiry
    ON reservations (tenant, sku, expires_at)
    WHERE status = 'HELD';
