//! Which policy each SKU runs: its own choice, stored with it, or the
//! coordinator's `--policy` for SKUs that did not choose.

use escrow_core::{ChoiceError, PolicyChoice};
use serde_json::{Map, Value};

/// The coordinator's default policy and what a SKU's choice starts from.
#[derive(Debug, Clone)]
pub struct Policies {
    default: PolicyChoice,
    sync_interval_ms: u64,
}

/// What an admin asks of a SKU's policy.
#[derive(Debug, Clone, Default)]
pub struct PolicyRequest {
    /// A policy by name; `None` keeps the SKU's current one.
    pub name: Option<String>,
    /// Settings to override, merged into the named (or current) policy's.
    pub settings: Option<Map<String, Value>>,
}

impl Policies {
    /// The policy `name` with its defaults is the default; agents sync
    /// every `sync_interval_ms`.
    pub fn new(name: &str, sync_interval_ms: u64) -> Result<Self, ChoiceError> {
        Ok(Self {
            default: PolicyChoice::defaults(name, sync_interval_ms)?,
            sync_interval_ms,
        })
    }

    /// The policy a SKU runs: its own `stored` choice, or the default.
    pub fn of<'a>(&'a self, stored: Option<&'a PolicyChoice>) -> &'a PolicyChoice {
        stored.unwrap_or(&self.default)
    }

    /// The SKU's choice after `request`, from its `stored` one: a named
    /// policy starts from that policy's defaults, settings alone from the
    /// policy the SKU runs now; a request naming neither keeps `stored`.
    pub fn choose(
        &self,
        stored: Option<&PolicyChoice>,
        request: &PolicyRequest,
    ) -> Result<Option<PolicyChoice>, ChoiceError> {
        let base = match &request.name {
            Some(name) => PolicyChoice::defaults(name, self.sync_interval_ms)?,
            None if request.settings.is_some() => self.of(stored).clone(),
            None => return Ok(stored.cloned()),
        };
        match &request.settings {
            Some(overrides) => base.with_overrides(overrides).map(Some),
            None => Ok(Some(base)),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn settings(v: Value) -> Option<Map<String, Value>> {
        v.as_object().cloned()
    }

    /// Goal: no request keeps what is stored (or the default); a name
    /// starts from that policy's defaults; settings alone change the policy
    /// the SKU runs now.
    #[test]
    fn a_request_changes_only_what_it_names() {
        let policies = Policies::new("tail-merge", 100).unwrap();
        assert_eq!(policies.choose(None, &PolicyRequest::default()), Ok(None));
        assert_eq!(policies.of(None).name(), "tail-merge");

        let refill = policies
            .choose(
                None,
                &PolicyRequest {
                    name: Some("refill".into()),
                    settings: settings(json!({"low_water_s": 3.0})),
                },
            )
            .unwrap();
        let Some(PolicyChoice::Refill(s)) = &refill else {
            panic!("not refill: {refill:?}")
        };
        assert_eq!((s.low_water_s, s.sync_interval_ms), (3.0, 100));

        let tuned = policies
            .choose(
                refill.as_ref(),
                &PolicyRequest {
                    name: None,
                    settings: settings(json!({"refill_s": 9.0})),
                },
            )
            .unwrap();
        let Some(PolicyChoice::Refill(t)) = tuned else {
            panic!("policy changed")
        };
        assert_eq!((t.low_water_s, t.refill_s), (3.0, 9.0));
        assert!(Policies::new("nope", 100).is_err());
    }
}
