//! Seeds that once broke an invariant, kept so the bug they found stays fixed.

use opledger_sim::{run_seed, SimConfig};

#[track_caller]
fn passes(seed: u64) {
    let report = run_seed(seed, &SimConfig::default());
    assert!(
        report.passed(),
        "seed {seed}: {:?}\nreproduce: {}\n{}",
        report.violations,
        report.reproduce_command(),
        report.trace_tail.join("\n")
    );
}

/// A retry claimed under a valid key contract, then a process stall (the key-aged jump) while
/// the claim's append waited: the engine sent the claim after the key had left its retention,
/// and the provider created a second object. Fixed by re-checking the contract and the lease
/// right before the send (`Engine::stale_claim`). Seeds 4148, 4822 and 5689 were the same bug.
#[test]
fn a_retry_whose_key_aged_while_its_claim_was_written_is_not_sent() {
    for seed in [1005, 4148, 4822, 5689] {
        passes(seed);
    }
}
