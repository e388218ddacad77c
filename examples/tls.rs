//! A lock over TLS (and an ACL user): a `rediss://` url, the CA that signed
//! the server's certificate if the system does not trust it, and a client
//! certificate for mutual TLS if the server asks for one.
//!
//! ```text
//! REDIS_TLS_URL=rediss://locker:secret@redis.internal:6380/ \
//! REDIS_TLS_CA=ca.pem cargo run --example tls
//! ```

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("REDIS_TLS_URL") else {
        println!(
            "no TLS server given: set REDIS_TLS_URL=rediss://[user:password@]host:port/ (and \
             REDIS_TLS_CA=ca.pem, REDIS_TLS_CERT/REDIS_TLS_KEY for mutual TLS); a local one: \
             https://redis.io/docs/latest/operate/oss_and_stack/management/security/encryption/"
        );
        return Ok(());
    };
    let mut builder = redlease::Client::builder(url.as_str());
    if let Ok(ca) = std::env::var("REDIS_TLS_CA") {
        builder = builder.tls_root_certificate(std::fs::read(ca)?);
    }
    if let (Ok(cert), Ok(key)) = (
        std::env::var("REDIS_TLS_CERT"),
        std::env::var("REDIS_TLS_KEY"),
    ) {
        builder = builder.tls_client_identity(std::fs::read(cert)?, std::fs::read(key)?);
    }
    let client = builder.build()?;
    let guard = client.lock("orders:tls-example").lock()?;
    println!("held over TLS");
    guard.unlock()?;
    Ok(())
}
