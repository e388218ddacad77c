//! TLS through rustls (ring provider), one client configuration per
//! endpoint (the `tls` feature): the configuration from the user's PEM
//! material, and a stream that one thread may read while others write.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme};

/// The TLS material a user configured (PEM).
#[derive(Clone, Default)]
pub(crate) struct TlsOptions {
    pub(crate) root_certificate: Option<Vec<u8>>,
    pub(crate) client_identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("root_certificate", &self.root_certificate.is_some())
            .field(
                "client_identity",
                &self.client_identity.as_ref().map(|_| "(cert, ***)"),
            )
            .finish()
    }
}

impl TlsOptions {
    pub(crate) fn is_set(&self) -> bool {
        self.root_certificate.is_some() || self.client_identity.is_some()
    }
}

/// A ready client configuration and the name to verify.
#[derive(Clone)]
pub(crate) struct Tls {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    pub(crate) fn new(host: &str, insecure: bool, opts: &TlsOptions) -> Result<Tls, String> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("{host:?} cannot be checked against a certificate: {e}"))?;
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        let builder = if insecure {
            log::warn!(
                "{host}: #insecure in the url turns off all certificate \
                 checks: anyone on the path can read and change the traffic"
            );
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider())))
        } else {
            builder.with_root_certificates(roots(opts.root_certificate.as_deref())?)
        };
        let mut config = match &opts.client_identity {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| {
                        format!("tls_client_identity: the certificate is not PEM ({e})")
                    })?;
                if chain.is_empty() {
                    return Err("tls_client_identity: no certificate in the PEM".into());
                }
                let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| {
                    format!(
                        "tls_client_identity: no private key in the PEM ({e}); use a \
                         PKCS#8, PKCS#1 or SEC1 key"
                    )
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    format!("tls_client_identity: the certificate and key do not fit ({e})")
                })?
            }
            None => builder.with_no_client_auth(),
        };
        if insecure {
            config.enable_sni = false;
        }
        Ok(Tls {
            config: Arc::new(config),
            name,
        })
    }

    /// The same configuration, checking the certificate against `host`
    /// (an IP address or a DNS name).
    pub(crate) fn for_host(&self, host: &str) -> Tls {
        let name = ServerName::try_from(host.to_owned()).unwrap_or_else(|_| self.name.clone());
        Tls {
            config: Arc::clone(&self.config),
            name,
        }
    }

    /// Runs the TLS handshake on a connected socket, within `timeout`.
    pub(crate) fn handshake(&self, sock: TcpStream, timeout: Duration) -> io::Result<TlsStream> {
        let deadline = Instant::now() + timeout;
        let mut conn = ClientConnection::new(Arc::clone(&self.config), self.name.clone())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        while conn.is_handshaking() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the TLS handshake did not finish within the connection timeout",
                ));
            }
            sock.set_read_timeout(Some(left))?;
            sock.set_write_timeout(Some(left))?;
            conn.complete_io(&mut &sock)
                .map_err(|e| explain(&e).unwrap_or(e))?;
        }
        Ok(TlsStream::new(sock, conn))
    }
}

/// Says what to do about a certificate the client or server refused.
fn explain(e: &io::Error) -> Option<io::Error> {
    let text = e.to_string();
    let hint = if text.contains("UnknownIssuer") || text.contains("invalid peer certificate") {
        "the server's certificate is not trusted: pass the CA that signed it with \
         tls_root_certificate, or check the host name in the url against the certificate"
    } else if text.contains("CertificateRequired") || text.contains("BadCertificate") {
        "the server wants a client certificate it trusts: set tls_client_identity"
    } else {
        return None;
    };
    Some(io::Error::new(e.kind(), format!("{text}: {hint}")))
}

fn roots(pem: Option<&[u8]>) -> Result<rustls::RootCertStore, String> {
    let mut store = rustls::RootCertStore::empty();
    match pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert =
                    cert.map_err(|e| format!("tls_root_certificate: not a PEM certificate ({e})"))?;
                store.add(cert).map_err(|e| {
                    format!("tls_root_certificate: cannot use the certificate ({e})")
                })?;
            }
            if store.is_empty() {
                return Err("tls_root_certificate: no certificate in the PEM".into());
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for e in &found.errors {
                log::warn!("reading the system's CA certificates: {e}");
            }
            let (_, ignored) = store.add_parsable_certificates(found.certs);
            if ignored > 0 {
                log::debug!("{ignored} system CA certificates were unusable");
            }
            if store.is_empty() {
                return Err("no CA certificates found on this system to verify the \
                            server with: pass one with tls_root_certificate"
                    .into());
            }
        }
    }
    Ok(store)
}

/// A TLS session over a socket: one thread may read while another writes.
pub(crate) struct TlsStream {
    pub(crate) sock: TcpStream,
    /// Held only to encrypt or decrypt in memory, never across socket I/O.
    session: Mutex<Session>,
    /// Set while one thread writes encrypted records to the socket, so
    /// that records go out in the order they were made.
    sending: AtomicBool,
    /// What the session failed on (say, the server refused our
    /// certificate), with a hint.
    pub(crate) failure: Mutex<Option<String>>,
}

struct Session {
    conn: ClientConnection,
    /// Bytes read from the socket that the session could not take yet
    /// (its plaintext buffer was full).
    raw: Vec<u8>,
}

impl Session {
    /// Feeds buffered socket bytes to the session as far as it takes
    /// them.
    fn feed(&mut self) -> Result<(), Fail> {
        while !self.raw.is_empty() {
            let mut data = &self.raw[..];
            match self.conn.read_tls(&mut data) {
                Ok(n) => {
                    self.raw.drain(..n);
                    self.conn.process_new_packets().map_err(Fail::Tls)?;
                }
                // Backpressure: the plaintext waits to be read first.
                Err(e) if e.kind() == io::ErrorKind::Other => return Ok(()),
                Err(e) => return Err(Fail::Io(e)),
            }
        }
        Ok(())
    }
}

enum Fail {
    Io(io::Error),
    Tls(rustls::Error),
}

fn tls_error(e: rustls::Error) -> io::Error {
    let e = io::Error::new(io::ErrorKind::InvalidData, e);
    explain(&e).unwrap_or(e)
}

impl TlsStream {
    fn new(sock: TcpStream, conn: ClientConnection) -> TlsStream {
        TlsStream {
            sock,
            session: Mutex::new(Session {
                conn,
                raw: Vec::new(),
            }),
            sending: AtomicBool::new(false),
            failure: Mutex::new(None),
        }
    }

    fn fail(&self, e: Fail) -> io::Error {
        match e {
            Fail::Io(e) => e,
            Fail::Tls(e) => self.failed(e),
        }
    }

    fn failed(&self, e: rustls::Error) -> io::Error {
        let e = tls_error(e);
        *self.failure.lock() = Some(e.to_string());
        e
    }

    /// Idle check: takes in, without blocking, what records arrived
    /// (a session ticket, or a close_notify) and tells whether the server
    /// closed the session or the stream, or sent plaintext unasked.
    pub(crate) fn idle_closed(&self) -> bool {
        if self.sock.set_nonblocking(true).is_err() {
            return true;
        }
        let mut raw = [0u8; 4096];
        let mut eof = false;
        let mut bad = false;
        loop {
            match (&self.sock).read(&mut raw) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    let mut s = self.session.lock();
                    s.raw.extend_from_slice(&raw[..n]);
                    if s.feed().is_err() {
                        bad = true;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    bad = true;
                    break;
                }
            }
        }
        let restored = self.sock.set_nonblocking(false).is_ok();
        if eof || bad || !restored {
            return true;
        }
        let mut s = self.session.lock();
        let mut one = [0u8; 1];
        // Ok(0): close_notify; Ok(_): plaintext nobody asked for.
        !matches!(s.conn.reader().read(&mut one), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    pub(crate) fn write_all(&self, buf: &[u8]) -> io::Result<()> {
        if !buf.is_empty() {
            self.session.lock().conn.writer().write_all(buf)?;
        }
        self.drain()
    }

    /// Writes the records waiting in the session, unless another thread
    /// is writing (it takes them too).
    fn drain(&self) -> io::Result<()> {
        loop {
            if self
                .sending
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                return Ok(());
            }
            let result = loop {
                let mut out = Vec::new();
                let made = {
                    let mut s = self.session.lock();
                    let mut made = Ok(());
                    while s.conn.wants_write() {
                        if let Err(e) = s.conn.write_tls(&mut out) {
                            made = Err(e);
                            break;
                        }
                    }
                    made
                };
                if let Err(e) = made {
                    break Err(e);
                }
                if out.is_empty() {
                    break Ok(());
                }
                if let Err(e) = (&self.sock).write_all(&out) {
                    break Err(e);
                }
            };
            self.sending.store(false, Ordering::Release);
            result?;
            if !self.session.lock().conn.wants_write() {
                return Ok(());
            }
        }
    }

    pub(crate) fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut raw = [0u8; 16 * 1024];
        loop {
            {
                let mut s = self.session.lock();
                s.feed().map_err(|e| self.fail(e))?;
                match s.conn.reader().read(buf) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            let n = (&self.sock).read(&mut raw)?;
            let wants_write = {
                let mut s = self.session.lock();
                if n == 0 {
                    // End of stream: the session reports a clean close
                    // or an unexpected end on the next read.
                    s.conn.read_tls(&mut &raw[..0])?;
                    s.conn.process_new_packets().map_err(|e| self.failed(e))?;
                } else {
                    s.raw.extend_from_slice(&raw[..n]);
                    s.feed().map_err(|e| self.fail(e))?;
                }
                s.conn.wants_write()
            };
            if wants_write {
                // An answer of the session itself (a key update, an
                // alert) goes out in turn with the commands.
                self.drain()?;
            }
        }
    }
}

/// `#insecure`: accepts any certificate, still checks the handshake's
/// signatures (as redis-rs does).
#[derive(Debug)]
struct NoVerification(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
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
            &self.0.signature_verification_algorithms,
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
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
