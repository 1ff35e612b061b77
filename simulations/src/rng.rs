//! Seeded pseudo-random numbers.
//!
//! One `u64` seed must reproduce a run bit for bit, so the generator lives
//! here rather than in a dependency whose algorithm could change with a
//! version bump: xoshiro256** (Blackman and Vigna) seeded through
//! splitmix64. Independent streams (each region's demand, each buyer, the
//! network) are derived from the seed and a stream number, so how often one
//! part of the simulation draws numbers never shifts what another part sees:
//! every policy in a comparison faces exactly the same buyers.

/// Stream numbers, one per consumer of randomness.
pub mod streams {
    /// Arrival times of one demand component (indexed by component).
    pub const ARRIVALS: u64 = 1;
    /// One buyer's behaviour (indexed by buyer).
    pub const BUYER: u64 = 2;
    /// Message loss, duplication and delay.
    pub const NETWORK: u64 = 3;
    /// Agents' sync phase offsets.
    pub const PHASE: u64 = 4;
    /// Swarm configuration.
    pub const SWARM: u64 = 5;
    /// The seed of a shop's SKU (indexed by SKU).
    pub const SKU: u64 = 6;
    /// Cart buyers' arrivals.
    pub const CARTS: u64 = 7;
    /// One cart buyer's items and behaviour (indexed by cart buyer).
    pub const CART: u64 = 8;
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// xoshiro256**: small, fast and good enough for simulation.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from `seed`.
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        Self {
            s: [
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
                splitmix64(&mut sm),
            ],
        }
    }

    /// The generator of item `index` of stream `stream` under `seed`.
    pub fn stream(seed: u64, stream: u64, index: u64) -> Self {
        let mut sm = seed ^ 0x5851_F42D_4C95_7F2D;
        let a = splitmix64(&mut sm);
        let mut sm = a ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let b = splitmix64(&mut sm);
        let mut sm = b ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03);
        Self::new(splitmix64(&mut sm))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in `0..n`; `n` must be positive.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "below(0) has no value");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(lo <= hi, "empty range {lo}..={hi}");
        lo + self.below(hi - lo + 1)
    }

    /// Uniform in `[lo, hi)`.
    pub fn range_f64(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the same seed gives the same numbers, and streams differ.
    #[test]
    fn seeds_reproduce_and_streams_differ() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        let mut s1 = Rng::stream(7, 1, 0);
        let mut s2 = Rng::stream(7, 1, 1);
        assert_ne!(s1.next_u64(), s2.next_u64());
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            assert!(r.range(3, 5) >= 3 && r.range(3, 5) <= 5);
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
        }
    }
}
