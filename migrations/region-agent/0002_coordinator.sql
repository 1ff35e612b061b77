-- Coordinator mode: quota arrives as grants and leaves as returns, each
-- with an id. A grant is credited once (the primary key here); a return is
-- debited together with its outbox row and deleted once the coordinator
-- confirms it applied it.

CREATE TABLE applied_grants (
    id          text PRIMARY KEY,
    tenant      text NOT NULL,
    sku         text NOT NULL,
    units       bigint NOT NULL CHECK (units > 0),
    applied_at  timestamptz NOT NULL DEFAULT now(),
    confirmed   boolean NOT NULL DEFAULT false,
    FOREIGN KEY (tenant, sku) REFERENCES sku_stock (tenant, sku)
);

CREATE INDEX applied_grants_unconfirmed ON applied_grants (id) WHERE NOT confirmed;

CREATE TABLE outbox_returns (
    id          text PRIMARY KEY,
    tenant      text NOT NULL,
    sku         text NOT NULL,
    units       bigint NOT NULL CHECK (units > 0),
    created_at  timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (tenant, sku) REFERENCES sku_stock (tenant, sku)
);

ALTER TABLE sku_stock
    ADD COLUMN mode text NOT NULL DEFAULT 'ESCROW' CHECK (mode IN ('ESCROW', 'CENTRAL'));
