//! TLS to the server through rustls, with libpq's `sslmode` meanings: `prefer` (the default) and
//! `require` encrypt without verifying the server's certificate, `verify-ca` checks that it
//! chains to a root this machine trusts, `verify-full` also that it names the host. Teams move
//! a libpq URL to opledger as it is, and a `require` that refused Debian's self-signed
//! certificate (what every fresh cluster has) would refuse what libpq accepts.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::PostgresError;

/// How the server's certificate is checked, from the URL's `sslmode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CertificateCheck {
    /// `disable`, `prefer`, `require`: not verified (libpq: only the `verify-` modes verify).
    None,
    /// `verify-ca`: it must chain to a trusted root; the host it names is not checked.
    Chain,
    /// `verify-full`: it must chain to a trusted root and name the host connected to.
    Full,
}

/// The rustls client configuration for `check`: the `ring` provider (as reqwest's in this tree)
/// and, when verifying, the operating system's roots.
pub(crate) fn connector(check: CertificateCheck) -> Result<MakeRustlsConnect, PostgresError> {
    let setup = |error: String| PostgresError::Setup {
        reason: format!("cannot set up TLS: {error}"),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| setup(error.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        CertificateCheck::None => Arc::new(Unverified { provider }),
        CertificateCheck::Chain | CertificateCheck::Full => {
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots()), provider)
                .build()
                .map_err(|error| setup(error.to_string()))?;
            match check {
                CertificateCheck::Chain => Arc::new(ChainOnly { webpki }),
                _ => webpki,
            }
        }
    };
    let config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

fn roots() -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls_native_certs::load_native_certs().certs {
        // A root the library cannot parse is skipped, as browsers do; the others still work.
        let _ = roots.add(certificate);
    }
    roots
}

/// Whether `error` (or what caused it) is a certificate rustls refused.
pub(crate) fn is_untrusted_certificate(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(error) = current {
        let rustls_error = error.downcast_ref::<rustls::Error>().or_else(|| {
            error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if matches!(rustls_error, Some(rustls::Error::InvalidCertificate(_))) {
            return true;
        }
        current = error.source();
    }
    false
}

/// Accepts any certificate, as libpq's `require` does; the handshake's signatures are still
/// checked against the certificate presented, so the session is encrypted to its holder.
#[derive(Debug)]
struct Unverified {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// libpq's `verify-ca`: the full check, except that a certificate for another name passes (rustls
/// checks the name only after the chain, so that refusal means the chain was trusted).
#[derive(Debug)]
struct ChainOnly {
    webpki: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}
