//! npm packages for the tests that run Node (the console's browser test, the TypeScript client):
//! installed with `npm ci` from a committed lock file into the target directory, once per lock
//! file. Made aside and renamed into place, as the Python test's environment is, so parallel
//! test processes never see a half-installed folder.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::python::python_venv::run;

/// The folder `<target tmp>/<name>` whose `node_modules` holds the packages of
/// `source/package-lock.json`, installed if it does not hold them yet. `marks` are paths under
/// `node_modules` whose presence says the install finished; `what` names the packages in a
/// failure.
pub fn installed(source: &Path, name: &str, marks: &[&str], what: &str) -> PathBuf {
    // Tests of one process ask at once; the folder made aside is named by the process, so its
    // threads take turns (other processes are kept apart by the rename below).
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = MAKING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let place = tmp.join(name);
    let lock = std::fs::read_to_string(source.join("package-lock.json"))
        .unwrap_or_else(|error| panic!("{what}: package-lock.json is committed ({error})"));
    let is_ready = |dir: &Path| {
        std::fs::read_to_string(dir.join("package-lock.json")).ok() == Some(lock.clone())
            && marks
                .iter()
                .all(|mark| dir.join("node_modules").join(mark).exists())
    };
    if is_ready(&place) {
        return place;
    }
    let aside = tmp.join(format!("{name}.making-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&aside);
    std::fs::create_dir_all(&aside).expect("a folder for the npm packages");
    for file in ["package.json", "package-lock.json"] {
        std::fs::copy(source.join(file), aside.join(file)).expect("the npm manifest");
    }
    run(
        Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
            .current_dir(&aside),
        &format!("npm ci of {what} (needs Node 20 and npm)"),
    );
    if place.exists() && !is_ready(&place) {
        let stale = tmp.join(format!("{name}.stale-{}", std::process::id()));
        if std::fs::rename(&place, &stale).is_ok() {
            let _ = std::fs::remove_dir_all(&stale);
        }
    }
    if std::fs::rename(&aside, &place).is_err() {
        // Another process put its own in place first: use that one.
        let _ = std::fs::remove_dir_all(&aside);
        assert!(is_ready(&place), "cannot put the npm packages in place");
    }
    place
}
