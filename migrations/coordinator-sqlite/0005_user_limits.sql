-- The per-user limit across regions; PostgreSQL's 0005 says why each part
-- is there.

ALTER TABLE skus ADD COLUMN user_limit_scope TEXT NOT NULL DEFAULT 'region'
    CHECK (user_limit_scope IN ('region', 'global'));

CREATE TABLE borrows (
    id          TEXT NOT NULL PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 128),
    tenant      TEXT NOT NULL,
    sku         TEXT NOT NULL,
    user_id     TEXT NOT NULL,
    borrower    TEXT NOT NULL,
    home        TEXT NOT NULL,
    state       TEXT NOT NULL
                CHECK (state IN ('ASKED', 'LENT', 'REFUSED', 'RETURNING', 'RETURNED')),
    created_at  INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    CHECK (borrower <> home)
) STRICT;

CREATE INDEX borrows_for_home ON borrows (home, state) WHERE state IN ('ASKED', 'RETURNING');
