//! TLS for the connections the store opens itself (feature `tls`): the
//! rustls client redis-rs would make for a `rediss://` URL (the system's
//! roots or the CA given, an optional client certificate, verification off
//! only when asked for by name), over a tokio TCP socket.

use crate::error::{ConfigError, ConfigErrorKind};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio_rustls::{client::TlsStream, TlsConnector};

/// The TLS client of a store's `rediss://` nodes, made once when the store
/// is built (a bad certificate is a configuration error, not a request's).
pub(crate) struct Connector(TlsConnector);

/// Gives rustls its cryptography (ring) unless the application chose one.
pub(crate) fn install_crypto_provider() {
    // Fails only when a provider is already installed: that one is used.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl Connector {
    /// Trusts `ca` (PEM; `None`: the system's roots), presents `client` (a
    /// certificate chain and its key, PEM) if given, and checks nothing
    /// when `insecure`.
    pub(crate) fn new(
        ca: Option<&[u8]>,
        client: Option<&(Vec<u8>, Vec<u8>)>,
        insecure: bool,
    ) -> Result<Self, ConfigError> {
        let bad = |what: &str, e: &dyn std::fmt::Display| {
            ConfigError::new(ConfigErrorKind::Store, format!("redis TLS {what}: {e}"))
        };
        install_crypto_provider();
        let mut roots = RootCertStore::empty();
        match ca {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| bad("CA certificate", &e))?;
                    roots.add(cert).map_err(|e| bad("CA certificate", &e))?;
                }
                if roots.is_empty() {
                    return Err(bad("CA certificate", &"no certificate in the PEM given"));
                }
            }
            // The system's roots, as redis-rs loads them; one that rustls
            // cannot use is skipped (the server's chain may not need it).
            None => {
                for cert in rustls_native_certs::load_native_certs().certs {
                    let _ = roots.add(cert);
                }
            }
        }
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let mut config = match client {
            Some((chain, key)) => {
                let chain = CertificateDer::pem_slice_iter(chain)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| bad("client certificate", &e))?;
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad("client key", &e))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| bad("client certificate", &e))?
            }
            None => builder.with_no_client_auth(),
        };
        if insecure {
            let provider = rustls::crypto::CryptoProvider::get_default()
                .ok_or_else(|| bad("setup", &"no rustls crypto provider"))?;
            config.enable_sni = false;
            config
                .dangerous()
                .set_certificate_verifier(Arc::new(AcceptAnyCertificate {
                    schemes: provider.signature_verification_algorithms,
                }));
        }
        Ok(Connector(TlsConnector::from(Arc::new(config))))
    }

    /// The TLS session over `socket` to `host` (a name or an IP address,
    /// checked against the server's certificate).
    pub(crate) async fn connect(
        &self,
        host: &str,
        socket: TcpStream,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        self.0.connect(name, socket).await
    }
}

/// Accepts any server certificate
/// ([`danger_accept_invalid_certificates`](super::RedisStoreBuilder::danger_accept_invalid_certificates)).
#[derive(Debug)]
struct AcceptAnyCertificate {
    schemes: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAnyCertificate {
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
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.supported_schemes()
    }
}
