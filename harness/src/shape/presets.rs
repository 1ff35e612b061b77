//! The named shapes `--shape` runs: on loopback, and at a distance.

use std::time::Duration;

use super::{Arrivals, Shape, ARRIVAL_WINDOW_DEFAULT, RETRYING_MAX_DEFAULT};

/// A preset: name, what it is, skew, units, buyers.
pub struct Preset {
    /// `--shape NAME`.
    pub name: &'static str,
    /// One line.
    pub about: &'static str,
    /// Demand share per region.
    pub skew: &'static [f64],
    /// Units on sale.
    pub units: u64,
    /// Buyers in all.
    pub buyers: u64,
    /// Part of `--shape all` (loopback) or `--shape distance` (at a distance).
    pub in_all: bool,
    /// Every buyer arrives within this window, ms (0: the default window).
    pub window_ms: u64,
    /// Stock weights (empty: 1 each).
    pub weights: &'static [u32],
    /// Round trips to the coordinator, ms (empty: loopback).
    pub rtt_ms: &'static [u64],
}

/// Round trips of the distance presets' three regions: about eu-west-1 to
/// eu-central-1, us-east-1 and ap-southeast-1.
pub const RTT_3: &[u64] = &[20, 80, 230];

/// Round trips of the five-region distance preset: two more far regions.
pub const RTT_5: &[u64] = &[20, 80, 230, 150, 180];

/// The presets, in the order `--shape all` runs them.
pub const PRESETS: [Preset; 4] = [
    Preset {
        name: "skewed-701",
        about: "issue 9's sale: 3 regions 85/10/5, 701 units, 2,600 buyers",
        skew: &[85.0, 10.0, 5.0],
        units: 701,
        buyers: 2_600,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
    Preset {
        name: "spread-700",
        about: "3 regions 50/30/20, 700 units, 1,400 buyers (2x)",
        skew: &[50.0, 30.0, 20.0],
        units: 700,
        buyers: 1_400,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
    Preset {
        name: "five-10k",
        about: "5 regions 60/20/10/5/5, 10,000 units, 20,000 buyers (2x)",
        skew: &[60.0, 20.0, 10.0, 5.0, 5.0],
        units: 10_000,
        buyers: 20_000,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
    Preset {
        name: "skewed-20x",
        about: "3 regions 85/10/5, 10,000 units, 200,000 buyers (20x)",
        skew: &[85.0, 10.0, 5.0],
        units: 10_000,
        buyers: 200_000,
        in_all: true,
        window_ms: 0,
        weights: &[],
        rtt_ms: &[],
    },
];

/// The shapes at a distance, in the order `--shape distance` runs them:
/// open-loop arrivals below capacity (800 buyers/s for 3.75 s) unless
/// named a burst, weights equal (the split misjudges demand) or equal to
/// demand (`-fit`).
pub const DISTANCE_PRESETS: [Preset; 6] = [
    Preset {
        name: "dist-spread",
        about: "3 regions at 20/80/230 ms, 50/30/20, weights 1/1/1, 1,201 units, 3,000 buyers at 800/s",
        skew: &[50.0, 30.0, 20.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-spread-fit",
        about: "as dist-spread, weights 5/3/2 (the split is the demand)",
        skew: &[50.0, 30.0, 20.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[5, 3, 2],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-skewed",
        about: "3 regions at 20/80/230 ms, 85/10/5, weights 1/1/1, 1,201 units, 3,000 buyers at 800/s",
        skew: &[85.0, 10.0, 5.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-skewed-fit",
        about: "as dist-skewed, weights 17/2/1 (the split is the demand)",
        skew: &[85.0, 10.0, 5.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 3_750,
        weights: &[17, 2, 1],
        rtt_ms: RTT_3,
    },
    Preset {
        name: "dist-five",
        about: "5 regions at 20/80/230/150/180 ms, 60/20/10/5/5, 10,000 units, 20,000 buyers at 2,000/s",
        skew: &[60.0, 20.0, 10.0, 5.0, 5.0],
        units: 10_000,
        buyers: 20_000,
        in_all: true,
        window_ms: 10_000,
        weights: &[],
        rtt_ms: RTT_5,
    },
    Preset {
        name: "dist-burst",
        about: "3 regions at 20/80/230 ms, 50/30/20, 1,201 units, 3,000 buyers within 0.5 s",
        skew: &[50.0, 30.0, 20.0],
        units: 1_201,
        buyers: 3_000,
        in_all: true,
        window_ms: 500,
        weights: &[],
        rtt_ms: RTT_3,
    },
];

impl Shape {
    /// The preset named `name`.
    pub fn preset(name: &str) -> anyhow::Result<Self> {
        let p = PRESETS
            .iter()
            .chain(&DISTANCE_PRESETS)
            .find(|p| p.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = PRESETS
                    .iter()
                    .chain(&DISTANCE_PRESETS)
                    .map(|p| p.name)
                    .collect();
                anyhow::anyhow!(
                    "no shape {name:?}; shapes: {}, all, distance",
                    names.join(", ")
                )
            })?;
        Ok(Self {
            name: p.name.to_owned(),
            skew: p.skew.to_vec(),
            units: p.units,
            buyers: p.buyers,
            window: if p.window_ms == 0 {
                ARRIVAL_WINDOW_DEFAULT
            } else {
                Duration::from_millis(p.window_ms)
            },
            arrivals: Arrivals::Even,
            checkout: None,
            retrying_max: RETRYING_MAX_DEFAULT,
            seed: 1,
            weights: p.weights.to_vec(),
            rtt_ms: p.rtt_ms.to_vec(),
        })
    }
}
