//! The operator console's assets: plain HTML, CSS and JavaScript modules, built into the binary
//! with `include_bytes!`, so `opledger serve` needs no web server, no front-end build step and
//! nothing from the internet at run time. The HTTP API serves them at `/console` with
//! [`CONTENT_SECURITY_POLICY`].
//!
//! The console is a client of the same JSON API as every other client (`/v1/...`): it has no data
//! path of its own. It keeps the bearer token in the tab's `sessionStorage` and sends it as an
//! `Authorization` header, so there are no cookies and no CSRF surface, and no secret ever sits in
//! a URL.
//!
//! It must never need an inline script, an inline style attribute or another origin: the policy
//! forbids all three, and a unit test below refuses assets that would need them.

#![forbid(unsafe_code)]

/// The policy every console answer carries: scripts, styles, images and API calls from this
/// origin only (no `data:` either); no inline script (`script-src 'self'` without `'unsafe-inline'`), no inline
/// style attribute, no plugins, no framing, no form posting anywhere, no `<base>` rewriting.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
form-action 'none'; frame-ancestors 'none'";

/// One file of the console.
#[derive(Debug)]
pub struct Asset {
    /// Its path under `/console/` (`index.html` is also served at `/console` itself).
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes, as committed under `assets/`.
    pub body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const SVG: &str = "image/svg+xml";

macro_rules! asset {
    ($path:literal, $type:expr) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!("../assets/", $path)),
        }
    };
}

/// Every file the console has; nothing else is served under `/console/`.
pub const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("console.css", CSS),
    asset!("favicon.svg", SVG),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("ui.js", JS),
    asset!("pages/overview.js", JS),
    asset!("pages/review.js", JS),
    asset!("pages/approvals.js", JS),
    asset!("pages/operations.js", JS),
    asset!("pages/timeline.js", JS),
    asset!("pages/trace.js", JS),
    asset!("pages/webhooks.js", JS),
];

/// The console's start page.
pub const INDEX: &Asset = &ASSETS[0];

/// The asset at `path` (relative to `/console/`), if the console has one.
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|asset| asset.path == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(asset: &Asset) -> &str {
        std::str::from_utf8(asset.body).expect("every console asset is UTF-8 text")
    }

    #[test]
    fn the_start_page_loads_its_script_as_a_module_file_and_has_no_inline_script() {
        let html = text(INDEX);
        assert_eq!(INDEX.path, "index.html");
        assert!(html.contains(r#"<script type="module" src="/console/app.js"></script>"#));
        // Every <script> names a file: the policy refuses inline ones, so one would silently
        // not run.
        for tag in html.split("<script").skip(1) {
            let open = &tag[..tag.find('>').expect("a script tag closes")];
            assert!(open.contains("src="), "an inline script: <script{open}>");
        }
    }

    #[test]
    fn no_asset_uses_what_the_policy_forbids() {
        for asset in ASSETS {
            let body = text(asset);
            for forbidden in [
                " onclick=",
                " onload=",
                " onsubmit=",
                " style=\"",
                "javascript:",
                "http://",
                "https://",
                "innerHTML",
                "eval(",
                "new Function",
            ] {
                // The SVG's XML namespace is a name, not a place anything is fetched from.
                if asset.content_type == SVG && forbidden == "http://" {
                    continue;
                }
                assert!(
                    !body.contains(forbidden),
                    "{} contains `{forbidden}`, which the policy refuses or which could inject markup",
                    asset.path
                );
            }
        }
    }

    #[test]
    fn every_module_a_script_imports_is_served() {
        for script in ASSETS.iter().filter(|asset| asset.content_type == JS) {
            let base = script.path.rsplit_once('/').map_or("", |(dir, _)| dir);
            for line in text(script).lines().filter(|l| l.starts_with("import ")) {
                let from = line
                    .split(['"', '\''])
                    .nth(1)
                    .expect("an import names a module");
                let resolved = resolve(base, from);
                assert!(
                    asset(&resolved).is_some(),
                    "{} imports {from} ({resolved}), which is not in ASSETS",
                    script.path
                );
            }
        }
    }

    /// `from` (`./x.js`, `../x.js`) relative to the folder `base`.
    fn resolve(base: &str, from: &str) -> String {
        let mut parts: Vec<&str> = base.split('/').filter(|p| !p.is_empty()).collect();
        for part in from.split('/') {
            match part {
                "." => {}
                ".." => {
                    parts.pop();
                }
                other => parts.push(other),
            }
        }
        parts.join("/")
    }
}
