//! The simulator's only source of randomness: SplitMix64, seeded from the run's one `u64`.
//!
//! Hand-written rather than a crate so that a seed means the same run on every build: the
//! sequence is fixed by these few lines, not by a dependency's version.

/// A small, fast, deterministic generator (SplitMix64). Not for keys anyone must not guess.
#[derive(Clone, Debug)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator whose whole sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for another purpose, derived from this seed and a stream number, so that
    /// drawing more in one stream never shifts another.
    pub fn derived(seed: u64, stream: u64) -> Self {
        let mut mixer = Self::new(seed ^ stream.wrapping_mul(0xa076_1d64_78bd_642f));
        Self::new(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..bound` (0 when `bound` is 0). The modulo bias is irrelevant here.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64().checked_rem(bound).unwrap_or(0)
    }

    /// A number in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }

    /// An index into a collection of `len` items; `len` must not be 0.
    pub fn index(&mut self, len: usize) -> usize {
        debug_assert!(len > 0, "an index into nothing");
        self.below(len as u64) as usize
    }

    /// True with probability `per_million` / 1,000,000.
    pub fn chance(&mut self, per_million: u32) -> bool {
        per_million > 0 && self.below(1_000_000) < u64::from(per_million)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_sequence_and_another_seed_another() {
        let draw = |seed| {
            let mut rng = SimRng::new(seed);
            (0..4).map(|_| rng.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn bounded_draws_stay_in_their_range() {
        let mut rng = SimRng::new(1);
        for _ in 0..1000 {
            assert!(rng.below(10) < 10);
            assert!((3..=5).contains(&rng.between(3, 5)));
        }
        assert_eq!(rng.below(0), 0);
        assert!(!rng.chance(0));
    }
}
