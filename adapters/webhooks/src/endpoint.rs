//! One configured endpoint: where it is, how it is signed, what it receives, and the address
//! rules every delivery obeys (SSRF).
//!
//! Only configured URLs are ever requested. HTTPS is required except for a loopback host written
//! as such (`127.0.0.1`, `[::1]`, `localhost`), which stays on this machine. Private, link-local,
//! shared and unspecified addresses (cloud metadata at 169.254.169.254, a LAN, a name that
//! resolves to loopback) are refused — when the URL names them and again when a name resolves to
//! them at delivery time — unless the endpoint's entry allows them by name
//! (`allow_private_network = true`).

use std::collections::BTreeSet;
use std::net::IpAddr;

use reqwest::Url;

use crate::signing::Secret;

/// Longest endpoint URL accepted, in bytes.
pub const MAX_URL_BYTES: usize = 2_048;
/// Longest endpoint id, in bytes (it names metrics labels and API paths).
pub const MAX_ENDPOINT_ID_BYTES: usize = 64;

/// One endpoint, checked.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Its name in the configuration, the API and the metrics.
    pub id: String,
    /// Where deliveries go.
    pub url: Url,
    /// The keys it is signed with (several while a secret is rotated).
    pub secrets: Vec<Secret>,
    /// The friendly event types it receives (`succeeded`, `needs_review`, …).
    pub events: BTreeSet<String>,
    /// The tenants whose operations it receives (`None`: every tenant).
    pub tenants: Option<BTreeSet<String>>,
    /// Whether private and link-local addresses are allowed (named in its entry).
    pub allow_private_network: bool,
    /// How long one event is retried before the endpoint is disabled, in seconds.
    pub retry_window_s: u64,
    /// The longest one attempt may take, in milliseconds.
    pub request_timeout_ms: u64,
}

impl Endpoint {
    /// Whether an event of friendly type `kind` for `tenant` goes to this endpoint.
    pub fn wants(&self, kind: &str, tenant: &str) -> bool {
        self.events.contains(kind)
            && self
                .tenants
                .as_ref()
                .is_none_or(|tenants| tenants.contains(tenant))
    }
}

/// Checks a configured URL: parsed, HTTPS unless loopback, no credentials in it, and no private
/// address literal unless `allow_private_network`. The message says what to write instead.
pub fn check_url(text: &str, allow_private_network: bool) -> Result<Url, String> {
    if text.len() > MAX_URL_BYTES {
        return Err(format!(
            "is {} bytes; a URL is at most {MAX_URL_BYTES}",
            text.len()
        ));
    }
    let url = Url::parse(text).map_err(|error| {
        format!("`{text}` is not a URL ({error}); write e.g. \"https://billing.example.com/hooks/opledger\"")
    })?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "carries credentials; remove user:password@ (receivers verify the signature instead)"
                .into(),
        );
    }
    let loopback = is_loopback_host(&url);
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => {
            return Err(format!(
                "`{text}` is plain HTTP to a host that is not loopback; use https:// (plain http is allowed only for 127.0.0.1, [::1] or localhost)"
            ))
        }
        other => return Err(format!("has scheme `{other}`; use https://")),
    }
    if let Some(ip) = literal_ip(&url) {
        if !loopback && !allow_private_network && is_private(ip) {
            return Err(format!(
                "`{ip}` is a private or link-local address; deliveries there are refused (SSRF) unless this entry says allow_private_network = true"
            ));
        }
    }
    Ok(url)
}

/// Whether `text` is a URL whose host is loopback written as such (false for no URL).
pub fn is_loopback_url(text: &str) -> bool {
    Url::parse(text).is_ok_and(|url| is_loopback_host(&url))
}

/// Whether the URL's host is loopback written as such: an address in 127.0.0.0/8, `::1`, or
/// `localhost`.
pub fn is_loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

fn literal_ip(url: &Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

/// Whether a delivery to `ip` would reach this machine, its network or its cloud's metadata
/// service rather than the public internet.
pub fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => {
            let [a, b, ..] = ip.octets();
            ip.is_private()
                || ip.is_loopback()
                || ip.is_link_local()
                || ip.is_unspecified()
                || ip.is_broadcast()
                // 100.64.0.0/10, carrier-grade NAT (shared address space).
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(ip) => match ip.to_ipv4_mapped() {
            Some(mapped) => is_private(IpAddr::V4(mapped)),
            None => {
                ip.is_loopback()
                    || ip.is_unspecified()
                    || ip.is_unique_local()
                    || ip.is_unicast_link_local()
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_is_required_except_for_loopback_written_as_such() {
        assert!(check_url("https://billing.example.com/hooks", false).is_ok());
        assert!(check_url("http://127.0.0.1:9000/hooks", false).is_ok());
        assert!(check_url("http://[::1]:9000/hooks", false).is_ok());
        assert!(check_url("http://localhost:9000/hooks", false).is_ok());
        let plain = check_url("http://billing.example.com/hooks", false).expect_err("plain");
        assert!(plain.contains("use https://"), "{plain}");
        assert!(check_url("ftp://example.com/", false).is_err());
        assert!(check_url("not a url", false).is_err());
        assert!(check_url("https://user:pw@example.com/", false).is_err());
    }

    #[test]
    fn private_and_link_local_literals_are_refused_unless_allowed_by_name() {
        for private in [
            "https://10.0.0.8/h",
            "https://192.168.1.1/h",
            "https://169.254.169.254/latest/meta-data",
            "https://100.64.0.1/h",
            "https://[fd00::1]/h",
            "https://[fe80::1]/h",
            "https://[::ffff:10.0.0.1]/h",
            "https://0.0.0.0/h",
        ] {
            let refused = check_url(private, false).expect_err(private);
            assert!(refused.contains("allow_private_network"), "{refused}");
            assert!(check_url(private, true).is_ok(), "{private}");
        }
        assert!(check_url("https://93.184.215.14/h", false).is_ok());
    }

    #[test]
    fn an_endpoint_wants_only_its_types_and_tenants() {
        let endpoint = Endpoint {
            id: "billing".into(),
            url: check_url("https://example.com", false).expect("valid"),
            secrets: Vec::new(),
            events: ["succeeded".to_owned()].into(),
            tenants: Some(["acme".to_owned()].into()),
            allow_private_network: false,
            retry_window_s: 1,
            request_timeout_ms: crate::DEFAULT_REQUEST_TIMEOUT_MS,
        };
        assert!(endpoint.wants("succeeded", "acme"));
        assert!(!endpoint.wants("unknown", "acme"));
        assert!(!endpoint.wants("succeeded", "globex"));
        let every_tenant = Endpoint {
            tenants: None,
            ..endpoint
        };
        assert!(every_tenant.wants("succeeded", "globex"));
    }
}
