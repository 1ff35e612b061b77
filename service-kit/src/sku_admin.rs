//! What the two services' SKU admin APIs have in common: both serve
//! `/v1/admin/skus/{tenant}/{sku}` with the same path, the same stock
//! body and the same bounds on units, so a client (escrowctl, the console)
//! drives either the same way. What a change does is each service's own.

use escrow_core::{IdError, Sku, Tenant};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};

/// Largest total or stock addition accepted: far above any real sale,
/// far below counter overflow.
pub const UNITS_MAX: u64 = 1_000_000_000_000;

/// The path `/v1/admin/skus/{tenant}/{sku}[/...]`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SkuPath {
    /// The tenant
    #[param(example = json!("acme"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    tenant: String,
    /// The SKU
    #[param(example = json!("drop"), pattern = "^[A-Za-z0-9._:-]{1,128}$", min_length = 1, max_length = 128)]
    sku: String,
}

impl SkuPath {
    /// The tenant and the SKU the path names, each parsed.
    pub fn parse(&self) -> Result<(Tenant, Sku), IdError> {
        Ok((Tenant::parse(&self.tenant)?, Sku::parse(&self.sku)?))
    }
}

/// `POST .../add-stock` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddStockBody {
    /// Units to add, 1..=10^12.
    #[schema(minimum = 1, maximum = 1_000_000_000_000_i64)]
    qty: i64,
}

impl AddStockBody {
    /// The units to add, 1..=[`UNITS_MAX`]; otherwise what is wrong.
    pub fn qty(&self) -> Result<u64, String> {
        match units(self.qty, "qty")? {
            0 => Err("qty must be at least 1".into()),
            qty => Ok(qty),
        }
    }
}

/// `raw` as a count of units, 0..=[`UNITS_MAX`]; otherwise what is wrong
/// with `field`.
pub fn units(raw: i64, field: &str) -> Result<u64, String> {
    u64::try_from(raw)
        .ok()
        .filter(|u| *u <= UNITS_MAX)
        .ok_or_else(|| format!("{field} must be an integer in 0..={UNITS_MAX}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a stock addition takes 1..=UNITS_MAX units and names `qty`
    /// when it refuses one.
    #[test]
    fn stock_is_added_in_bounds() {
        let body = |qty| AddStockBody { qty };
        assert_eq!(body(1).qty(), Ok(1));
        assert_eq!(body(UNITS_MAX as i64).qty(), Ok(UNITS_MAX));
        assert_eq!(body(0).qty(), Err("qty must be at least 1".into()));
        for refused in [-1, UNITS_MAX as i64 + 1] {
            assert!(body(refused).qty().is_err_and(|e| e.starts_with("qty")));
        }
    }
}
