-- The coordinator's database: each SKU's total, its pool, every region's
-- lease, and every transfer between them. `pool + in_transit + leased = total`
-- per SKU, where in_transit is the sum of PENDING grants.

CREATE TABLE skus (
    tenant        text NOT NULL,
    sku           text NOT NULL,
    total         bigint NOT NULL CHECK (total >= 0),
    pool          bigint NOT NULL CHECK (pool >= 0),
    mode          text NOT NULL DEFAULT 'ESCROW' CHECK (mode IN ('ESCROW', 'CENTRAL')),
    paused        boolean NOT NULL DEFAULT false,
    max_per_user  integer NOT NULL CHECK (max_per_user BETWEEN 1 AND 1000),
    hold_ttl_ms   bigint NOT NULL CHECK (hold_ttl_ms BETWEEN 1000 AND 3600000),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, sku),
    CHECK (pool <= total)
);

-- One region's share of one SKU, and its last report.
CREATE TABLE sku_regions (
    tenant              text NOT NULL,
    sku                 text NOT NULL,
    region              text NOT NULL CHECK (region ~ '^[a-z0-9-]{1,32}$'),
    weight              integer NOT NULL CHECK (weight >= 0),
    leased              bigint NOT NULL DEFAULT 0 CHECK (leased >= 0),
    returned            bigint NOT NULL DEFAULT 0 CHECK (returned >= 0),
    recall_pending      bigint NOT NULL DEFAULT 0 CHECK (recall_pending >= 0),
    reported_available  bigint NOT NULL DEFAULT 0 CHECK (reported_available >= 0),
    reported_held       bigint NOT NULL DEFAULT 0 CHECK (reported_held >= 0),
    reported_sold       bigint NOT NULL DEFAULT 0 CHECK (reported_sold >= 0),
    sale_rate_per_s     double precision NOT NULL DEFAULT 0,
    reported_at         timestamptz,
    PRIMARY KEY (tenant, sku, region),
    FOREIGN KEY (tenant, sku) REFERENCES skus (tenant, sku)
);

-- Grants (pool -> region) and returns (region -> pool). A grant is PENDING
-- from the pool's debit until the region acknowledges it; a return is
-- recorded DELIVERED when applied. The primary key makes every transfer
-- apply once.
CREATE TABLE transfers (
    id            text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    tenant        text NOT NULL,
    sku           text NOT NULL,
    region        text NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('GRANT', 'RETURN')),
    units         bigint NOT NULL CHECK (units > 0),
    state         text NOT NULL CHECK (state IN ('PENDING', 'DELIVERED')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    delivered_at  timestamptz,
    FOREIGN KEY (tenant, sku, region) REFERENCES sku_regions (tenant, sku, region),
    CHECK (kind = 'GRANT' OR state = 'DELIVERED')
);

CREATE INDEX transfers_pending ON transfers (region, tenant, sku) WHERE state = 'PENDING';

-- Each region agent's last sync: its epoch orders processes, seq orders
-- reports within one process.
CREATE TABLE regions (
    region        text PRIMARY KEY CHECK (region ~ '^[a-z0-9-]{1,32}$'),
    epoch         bigint NOT NULL,
    seq           bigint NOT NULL,
    rtt_ms        bigint NOT NULL DEFAULT 0,
    last_sync_at  timestamptz NOT NULL DEFAULT now()
);
