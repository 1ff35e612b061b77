-- Of a region's reported held units, those its owners set aside for carts
-- not yet written: they may come back, so while any region has some the
-- SKU is not sold out everywhere.
ALTER TABLE sku_regions ADD COLUMN reported_set_aside INTEGER NOT NULL DEFAULT 0
    CHECK (reported_set_aside >= 0 AND reported_set_aside <= reported_held);
