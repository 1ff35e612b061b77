//! A SKU's policy as an admin chooses it: a name and its settings.
//!
//! The coordinator runs, per SKU, the [`PolicyChoice`] stored with it, or
//! its own default for SKUs that chose none. An admin names a policy and
//! overrides some of its settings ([`PolicyChoice::with_overrides`]); the
//! overrides are merged into the policy's defaults key by key, and a name,
//! key or value that does not fit is refused with the reason, so a stored
//! choice is always one the policies accept. The same choice builds the
//! [`Policy`] the coordinator and the simulator run ([`PolicyChoice::build`]).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::policy::{
    CentralOnly, Policy, ProportionalShare, RefillOnLowWater, RefillSettings, StaticSplit,
    TailMerge, TailMergeSettings,
};

/// Most round trips a merge horizon may count.
const ROUND_TRIPS_MAX: u64 = 100;

/// Longest sync interval or merge horizon a setting may name, ms.
const INTERVAL_MS_MAX: u64 = 60_000;

/// A policy and all of its settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", content = "settings", rename_all = "kebab-case")]
pub enum PolicyChoice {
    /// [`StaticSplit`]: no settings.
    Static,
    /// [`RefillOnLowWater`].
    Refill(RefillSettings),
    /// [`ProportionalShare`].
    Proportional(ProportionalShare),
    /// [`TailMerge`].
    TailMerge(TailMergeSettings),
    /// [`CentralOnly`]: no settings.
    Central,
}

/// Why a choice was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    /// No policy has this name.
    #[error("unknown policy {0:?}; known: static, refill, proportional, tail-merge, central")]
    UnknownPolicy(String),
    /// A setting the policy does not have.
    #[error("policy {policy} has no setting {key:?}")]
    UnknownSetting {
        /// The policy.
        policy: &'static str,
        /// The key, dotted for nested settings.
        key: String,
    },
    /// A value of the wrong type or out of range.
    #[error("policy {policy}: {why}")]
    BadValue {
        /// The policy.
        policy: &'static str,
        /// What is wrong.
        why: String,
    },
}

impl PolicyChoice {
    /// Every policy name, in the order reports list them.
    pub const NAMES: [&'static str; 5] =
        ["static", "refill", "proportional", "tail-merge", "central"];

    /// The policy `name` with its default settings, for agents that sync
    /// every `sync_interval_ms`.
    pub fn defaults(name: &str, sync_interval_ms: u64) -> Result<Self, ChoiceError> {
        let refill = RefillSettings {
            sync_interval_ms,
            ..RefillSettings::default()
        };
        Ok(match name {
            "static" => Self::Static,
            "refill" => Self::Refill(refill),
            "proportional" => Self::Proportional(ProportionalShare::default()),
            "tail-merge" => {
                let d = TailMergeSettings::default();
                Self::TailMerge(TailMergeSettings {
                    refill: RefillSettings {
                        sync_interval_ms,
                        ..d.refill
                    },
                    ..d
                })
            }
            "central" => Self::Central,
            _ => return Err(ChoiceError::UnknownPolicy(name.to_owned())),
        })
    }

    /// `self` with `overrides` merged into its settings: each key must be
    /// one of the policy's settings (objects for nested settings, e.g.
    /// `{"refill": {"low_water_s": 2}}`), each value of its type and range.
    pub fn with_overrides(&self, overrides: &Map<String, Value>) -> Result<Self, ChoiceError> {
        let policy = self.name();
        let mut whole = serde_json::to_value(self).map_err(|e| bad(policy, e))?;
        match whole.get_mut("settings") {
            Some(Value::Object(settings)) => merge(policy, "", settings, overrides)?,
            _ => {
                if let Some(key) = overrides.keys().next() {
                    return Err(ChoiceError::UnknownSetting {
                        policy,
                        key: key.clone(),
                    });
                }
            }
        }
        let merged: Self = serde_json::from_value(whole).map_err(|e| bad(policy, e))?;
        merged.validate()?;
        Ok(merged)
    }

    /// A stored choice: its name and its settings as [`Self::settings`] wrote them.
    pub fn from_parts(name: &str, settings: Value) -> Result<Self, ChoiceError> {
        let mut whole = Map::new();
        whole.insert("name".into(), Value::String(name.to_owned()));
        if !settings.is_null() {
            whole.insert("settings".into(), settings);
        }
        let choice: Self = serde_json::from_value(Value::Object(whole)).map_err(|e| {
            match Self::NAMES.iter().find(|n| **n == name) {
                Some(policy) => bad(policy, e),
                None => ChoiceError::UnknownPolicy(name.to_owned()),
            }
        })?;
        choice.validate()?;
        Ok(choice)
    }

    /// The policy's name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::Refill(_) => "refill",
            Self::Proportional(_) => "proportional",
            Self::TailMerge(_) => "tail-merge",
            Self::Central => "central",
        }
    }

    /// The settings as JSON (`null` for a policy without settings).
    pub fn settings(&self) -> Value {
        serde_json::to_value(self)
            .ok()
            .and_then(|mut v| v.get_mut("settings").map(Value::take))
            .unwrap_or(Value::Null)
    }

    /// The policy this choice names, with its settings.
    pub fn build(&self) -> Box<dyn Policy> {
        match self {
            Self::Static => Box::new(StaticSplit),
            Self::Refill(settings) => Box::new(RefillOnLowWater {
                settings: *settings,
            }),
            Self::Proportional(share) => Box::new(share.clone()),
            Self::TailMerge(settings) => Box::new(TailMerge {
                settings: *settings,
            }),
            Self::Central => Box::new(CentralOnly),
        }
    }

    /// Refuses settings no policy should run with.
    fn validate(&self) -> Result<(), ChoiceError> {
        let policy = self.name();
        let why = match self {
            Self::Static | Self::Central => None,
            Self::Refill(refill) => refill_problem(refill),
            Self::Proportional(share) => {
                fraction_problem("reserve_fraction", share.reserve_fraction)
            }
            Self::TailMerge(tail) => refill_problem(&tail.refill)
                .or_else(|| fraction_problem("merge_fraction", tail.merge_fraction))
                .or_else(|| {
                    (tail.merge_horizon_ms > INTERVAL_MS_MAX)
                        .then(|| format!("merge_horizon_ms must be at most {INTERVAL_MS_MAX}"))
                })
                .or_else(|| {
                    (tail.merge_round_trips > ROUND_TRIPS_MAX)
                        .then(|| format!("merge_round_trips must be at most {ROUND_TRIPS_MAX}"))
                })
                .or_else(|| {
                    (tail.merge_rtt_max_ms > INTERVAL_MS_MAX)
                        .then(|| format!("merge_rtt_max_ms must be at most {INTERVAL_MS_MAX}"))
                })
                .or_else(|| {
                    let k = tail.keep_round_trips;
                    (!(k.is_finite() && (0.0..=ROUND_TRIPS_MAX as f64).contains(&k)))
                        .then(|| format!("keep_round_trips must be in 0.0..={ROUND_TRIPS_MAX}"))
                })
                .or_else(|| {
                    (tail.move_overhead_ms > INTERVAL_MS_MAX)
                        .then(|| format!("move_overhead_ms must be at most {INTERVAL_MS_MAX}"))
                }),
        };
        why.map_or(Ok(()), |why| Err(ChoiceError::BadValue { policy, why }))
    }
}

fn bad(policy: &'static str, error: impl std::fmt::Display) -> ChoiceError {
    ChoiceError::BadValue {
        policy,
        why: error.to_string(),
    }
}

fn fraction_problem(key: &str, value: f64) -> Option<String> {
    (!(0.0..=1.0).contains(&value)).then(|| format!("{key} must be in 0.0..=1.0"))
}

fn refill_problem(refill: &RefillSettings) -> Option<String> {
    let seconds = |key: &str, v: f64| {
        (!(v.is_finite() && (0.0..=3_600.0).contains(&v)))
            .then(|| format!("{key} must be in 0..=3600 seconds"))
    };
    fraction_problem("reserve_fraction", refill.reserve_fraction)
        .or_else(|| seconds("low_water_s", refill.low_water_s))
        .or_else(|| seconds("refill_s", refill.refill_s))
        .or_else(|| {
            (!(1..=INTERVAL_MS_MAX).contains(&refill.sync_interval_ms))
                .then(|| format!("sync_interval_ms must be in 1..={INTERVAL_MS_MAX}"))
        })
}

/// Merges `overrides` into `settings` key by key; `prefix` names the
/// nesting for errors.
fn merge(
    policy: &'static str,
    prefix: &str,
    settings: &mut Map<String, Value>,
    overrides: &Map<String, Value>,
) -> Result<(), ChoiceError> {
    for (key, value) in overrides {
        let path = format!("{prefix}{key}");
        let Some(slot) = settings.get_mut(key) else {
            return Err(ChoiceError::UnknownSetting { policy, key: path });
        };
        match (slot, value) {
            (Value::Object(nested), Value::Object(inner)) => {
                merge(policy, &format!("{path}."), nested, inner)?;
            }
            (Value::Object(_), _) => {
                return Err(bad(
                    policy,
                    format!("{path} is a group of settings, not a value"),
                ));
            }
            (slot, value) => *slot = value.clone(),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn overrides(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    /// Goal: every name builds the policy of that name with its defaults,
    /// and a stored choice reads back as itself.
    #[test]
    fn names_round_trip() {
        for name in PolicyChoice::NAMES {
            let choice = PolicyChoice::defaults(name, 200).unwrap();
            assert_eq!(choice.name(), name);
            assert_eq!(choice.build().name(), name);
            let back = PolicyChoice::from_parts(name, choice.settings()).unwrap();
            assert_eq!(back, choice);
        }
        assert_eq!(
            PolicyChoice::defaults("fastest", 200),
            Err(ChoiceError::UnknownPolicy("fastest".into()))
        );
    }

    /// Goal: overrides change only what they name, nested keys included,
    /// and the coordinator's sync interval is the default's.
    #[test]
    fn overrides_merge_into_defaults() {
        let tail = PolicyChoice::defaults("tail-merge", 50).unwrap();
        let merged = tail
            .with_overrides(&overrides(json!({
                "merge_horizon_ms": 800, "refill": {"low_water_s": 2.5}
            })))
            .unwrap();
        let PolicyChoice::TailMerge(s) = merged else {
            panic!("policy changed")
        };
        assert_eq!(s.merge_horizon_ms, 800);
        assert_eq!(s.refill.low_water_s, 2.5);
        assert_eq!(s.refill.sync_interval_ms, 50);
        assert_eq!(s.merge_units, TailMergeSettings::default().merge_units);
    }

    /// Goal: an unknown key, a wrong type, a value out of range and
    /// settings for a policy without any are each refused with the reason.
    #[test]
    fn bad_settings_are_refused() {
        let tail = PolicyChoice::defaults("tail-merge", 200).unwrap();
        let refused = |choice: &PolicyChoice, v: Value| {
            choice
                .with_overrides(&overrides(v))
                .unwrap_err()
                .to_string()
        };
        assert!(refused(&tail, json!({"merge_unit": 3})).contains("no setting \"merge_unit\""));
        assert!(refused(&tail, json!({"refill": {"nope": 1}})).contains("\"refill.nope\""));
        assert!(refused(&tail, json!({"merge_units": "many"})).contains("tail-merge"));
        assert!(refused(&tail, json!({"merge_fraction": 1.5})).contains("merge_fraction"));
        assert!(refused(&tail, json!({"refill": 3})).contains("group of settings"));
        assert!(refused(&tail, json!({"merge_units": -1})).contains("tail-merge"));
        let central = PolicyChoice::defaults("central", 200).unwrap();
        assert!(refused(&central, json!({"merge_units": 3})).contains("no setting"));
        assert!(PolicyChoice::from_parts("tail-merge", json!({"merge_units": 1})).is_err());
    }
}
