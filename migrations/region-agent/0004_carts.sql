-- Carts: several SKUs held together under one request key, all or nothing.
-- Each item is an ordinary reservation row keyed '{cart key}/{sku}' ('/'
-- is no identifier character, so no buyer's key is ever an item's), so the
-- counters, the rows-against-counters check and the one-active-per-user
-- index cover items as they cover every hold. This row is the cart's one
-- status and expiry: every transition of the cart is a conditional UPDATE
-- of it, in the same transaction as its items' rows and counters, so its
-- items never part ways.
CREATE TABLE carts (
    tenant       text COLLATE "C" NOT NULL,
    request_key  text COLLATE "C" NOT NULL,
    user_id      text COLLATE "C" NOT NULL,
    items        integer NOT NULL CHECK (items BETWEEN 1 AND 20),
    status       text NOT NULL CHECK (status IN ('HELD', 'SOLD', 'RELEASED', 'EXPIRED')),
    expires_at   timestamptz NOT NULL,
    extended     boolean NOT NULL DEFAULT false,
    created_at   timestamptz NOT NULL,
    PRIMARY KEY (tenant, request_key)
);

-- The cart expiry reads only held carts.
CREATE INDEX carts_held_by_expiry ON carts (expires_at) WHERE status = 'HELD';
