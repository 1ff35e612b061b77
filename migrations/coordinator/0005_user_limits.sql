-- The per-user limit across regions (docs/protocol.md, "Per-user limit
-- across regions").

ALTER TABLE skus ADD COLUMN user_limit_scope text NOT NULL DEFAULT 'region'
    CHECK (user_limit_scope IN ('region', 'global'));

-- A user's place under a global limit, borrowed by one region from the
-- user's home region, relayed here: ASKED (the home has not answered),
-- LENT or REFUSED (its answer), RETURNING (the borrower gave it back and
-- the home has not yet taken it), RETURNED (home again, or never lent).
-- The primary key makes each borrow id one loan at most; a return that
-- arrives before its ask records the id as RETURNED, so the late ask is
-- never relayed.
CREATE TABLE borrows (
    id          text PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    tenant      text NOT NULL,
    sku         text NOT NULL,
    user_id     text NOT NULL,
    borrower    text NOT NULL,
    home        text NOT NULL,
    state       text NOT NULL
                CHECK (state IN ('ASKED', 'LENT', 'REFUSED', 'RETURNING', 'RETURNED')),
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK (borrower <> home)
);

-- What a home is asked to lend or take back.
CREATE INDEX borrows_for_home ON borrows (home, state) WHERE state IN ('ASKED', 'RETURNING');
