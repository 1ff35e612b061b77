-- Each SKU's report is applied in its own short transaction, so reports are
-- ordered per SKU and region: `(report_epoch, report_seq)` is the sync
-- request whose report is stored, and only a newer request replaces it.
-- A full sync lists the region's SKUs by region.
ALTER TABLE sku_regions ADD COLUMN report_epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sku_regions ADD COLUMN report_seq INTEGER NOT NULL DEFAULT 0 CHECK (report_seq >= 0);
CREATE INDEX sku_regions_region ON sku_regions (region, tenant, sku);
