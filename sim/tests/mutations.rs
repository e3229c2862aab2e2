//! The mutation patches (`sim/mutations/*.patch`) still apply to the tree they are meant to
//! break. `sim/mutations/run.sh` is run by hand, so a patch that no longer applies would only be
//! found the next time someone measures the simulator; patch 01 broke at the first engine change
//! after it was written. This checks each one with `git apply --check`, which changes nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the sim crate sits in the workspace")
        .to_path_buf()
}

#[test]
fn every_mutation_patch_still_applies_to_the_tree() {
    let root = workspace_root();
    let mut patches: Vec<PathBuf> = std::fs::read_dir(root.join("sim/mutations"))
        .expect("sim/mutations is readable")
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "patch"))
        .collect();
    patches.sort();
    assert!(
        patches.len() >= 4,
        "the mutation table has four patches; found {patches:?}"
    );
    for patch in &patches {
        let checked = Command::new("git")
            .arg("apply")
            .arg("--check")
            .arg(patch)
            .current_dir(&root)
            .output()
            .expect("git runs (the project is built from a git checkout)");
        assert!(
            checked.status.success(),
            "{} no longer applies; rebase it on the current code (see sim/mutations/run.sh):\n{}",
            patch.display(),
            String::from_utf8_lossy(&checked.stderr)
        );
    }
}
