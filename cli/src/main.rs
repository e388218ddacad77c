//! `redlease`: who holds a lock on Redis and who waits for it, from a
//! terminal. It reads the Redisson layout that redlease and Redisson share,
//! so it shows the holders of either, with the host, process id and name of
//! every redlease holder.
//!
//! ```text
//! redlease --url redis://127.0.0.1:6379/ inspect orders:42
//! redlease --url redis://10.0.0.5:7000/ --cluster list 'orders:*'
//! redlease force-unlock orders:42 --yes
//! redlease watch 'orders:*'
//! ```
//!
//! Exit codes: 0 done; 1 nothing there (no such name, nothing held to
//! unlock, not a lock); 2 bad usage; 3 Redis could not be reached or
//! refused; 4 force-unlock not confirmed.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use redlease::{Client, HoldMode, Holder, Inspection, ObjectKind, ProcessInfo, Waiter};
use serde_json::{json, Value};

/// Who holds a Redis lock, and who waits for it (redlease and Redisson
/// locks, semaphores, latches).
#[derive(Parser, Debug)]
#[command(
    name = "redlease",
    version,
    about,
    long_about = None,
    after_help = "Exit codes: 0 done; 1 nothing there (no such name, nothing held to unlock, \
                  not a lock); 2 bad usage; 3 Redis not reached or refused; 4 force-unlock \
                  not confirmed; 5 the output could not be written."
)]
struct Cli {
    /// The server: `redis://` or `rediss://` (TLS), with `user:password@`
    /// for an ACL user. Give it several times for a Cluster's seeds or a
    /// Sentinel group's sentinels.
    #[arg(
        long,
        short = 'u',
        env = "REDIS_URL",
        // The url may hold a password: never print REDIS_URL in --help.
        hide_env_values = true,
        value_delimiter = ',',
        default_value = "redis://127.0.0.1:6379/"
    )]
    url: Vec<String>,

    /// The urls are seeds of a Redis Cluster.
    #[arg(long, conflicts_with = "sentinel_master")]
    cluster: bool,

    /// The urls are sentinels; follow the master of this name.
    #[arg(long, value_name = "NAME")]
    sentinel_master: Option<String>,

    /// A PEM file of the CA that signed the servers' certificates (for
    /// `rediss://` urls whose servers the system does not trust).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,

    /// How long to wait for a connection and for each reply.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 2.0,
        allow_negative_numbers = true
    )]
    timeout: f64,

    /// Print JSON (one document; `watch` prints one line per refresh).
    #[arg(long, global = true)]
    json: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// What a name is, who holds it (with their process), how long the
    /// lease lasts, and who waits.
    Inspect {
        /// The lock's (or semaphore's, latch's) name.
        name: String,
    },
    /// The locks, semaphores and counters whose name matches PATTERN
    /// (found with SCAN, never KEYS).
    List {
        /// A glob: `*`, `?`, `[abc]`.
        #[arg(default_value = "*")]
        pattern: String,
    },
    /// Deletes a lock whoever holds it and wakes its waiters; asks first
    /// (showing the holders), and does nothing if they changed meanwhile.
    ForceUnlock {
        /// The lock's name.
        name: String,
        /// Do not ask.
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// A live view: one line per object with its holder, a bar for the lease
    /// left, and its waiters, refreshed every --interval seconds until
    /// Ctrl-C; it keeps going (and says so) while Redis cannot be reached.
    Watch {
        /// A glob: `*`, `?`, `[abc]`.
        #[arg(default_value = "*")]
        pattern: String,
        /// Seconds between refreshes.
        #[arg(
            long,
            value_name = "SECONDS",
            default_value_t = 1.0,
            allow_negative_numbers = true
        )]
        interval: f64,
        /// Stop after this many refreshes (default: never).
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
}

/// Exit codes.
const NOTHING: u8 = 1;
const UNREACHABLE: u8 = 3;
const NOT_CONFIRMED: u8 = 4;
const OUTPUT: u8 = 5;

/// A failure: what to print, and the exit code.
struct Failure(u8, String);

impl From<redlease::Error> for Failure {
    fn from(e: redlease::Error) -> Failure {
        let code = if e.is_invalid_argument() {
            2
        } else {
            UNREACHABLE
        };
        // The cause too: "redis answered with an error" alone does not tell
        // an operator what went wrong.
        let mut message = e.to_string();
        let mut cause = std::error::Error::source(&e);
        while let Some(c) = cause {
            let c_text = c.to_string();
            if !message.ends_with(&c_text) {
                message.push_str(&format!(": {c_text}"));
            }
            cause = c.source();
        }
        Failure(code, message)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            // The reader is gone (`| head`): stop, quietly.
            Failure(0, String::new())
        } else {
            Failure(OUTPUT, format!("cannot write the output: {e}"))
        }
    }
}

/// Writes `s` and flushes: an output that cannot be written ends the command.
fn emit(out: &mut impl Write, s: &str) -> Result<(), Failure> {
    out.write_all(s.as_bytes())?;
    out.flush()?;
    Ok(())
}

/// `s` with control characters (newlines, escape sequences) escaped: names
/// and owner fields are any bytes a client wrote, not text for the terminal.
fn clean(s: &str) -> std::borrow::Cow<'_, str> {
    if s.chars().any(char::is_control) {
        s.chars()
            .map(|c| {
                if c.is_control() {
                    c.escape_default().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect::<String>()
            .into()
    } else {
        s.into()
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            if !message.is_empty() {
                let _ = writeln!(std::io::stderr(), "redlease: {message}");
            }
            ExitCode::from(code)
        }
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    // Bad usage is told before any connection is tried (exit 2, not 3).
    if let Command::Watch { interval, .. } = &cli.command {
        seconds("--interval", *interval)?;
    }
    let client = connect(cli)?;
    let mut out = std::io::stdout().lock();
    match &cli.command {
        Command::Inspect { name } => {
            let found = client.inspect(name)?;
            if cli.json {
                emit(&mut out, &json_text(&inspection_json(&found)))?;
            } else {
                emit(&mut out, &inspection_text(&found))?;
            }
            if found.kind == ObjectKind::Missing {
                return Err(Failure(
                    NOTHING,
                    format!("no lock, semaphore or latch named {name:?}"),
                ));
            }
            Ok(())
        }
        Command::List { pattern } => {
            let found = client.list(pattern)?;
            if cli.json {
                emit(
                    &mut out,
                    &json_text(&Value::Array(found.iter().map(inspection_json).collect())),
                )?;
            } else {
                let text: String = found.iter().map(|i| list_line(i, None) + "\n").collect();
                emit(&mut out, &text)?;
            }
            Ok(())
        }
        Command::ForceUnlock { name, yes } => force_unlock(&client, name, *yes, cli.json, &mut out),
        Command::Watch {
            pattern,
            interval,
            count,
        } => watch(&client, pattern, *interval, *count, cli.json, &mut out),
    }
}

fn seconds(what: &str, s: f64) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| *d >= Duration::from_millis(1) && *d <= Duration::from_secs(86_400))
        .ok_or_else(|| {
            Failure(
                2,
                format!("{what} must be 0.001 to 86400 seconds, got {}", {
                    if s.abs() < 1e9 {
                        format!("{s}")
                    } else {
                        format!("{s:e}")
                    }
                }),
            )
        })
}

fn connect(cli: &Cli) -> Result<Client, Failure> {
    let timeout = seconds("--timeout", cli.timeout)?;
    let mut builder = if cli.cluster {
        Client::cluster_builder(cli.url.iter().map(String::as_str))
    } else if let Some(master) = &cli.sentinel_master {
        Client::sentinel_builder(cli.url.iter().map(String::as_str), master)
    } else {
        match cli.url.as_slice() {
            [url] => Client::builder(url.as_str()),
            _ => {
                return Err(Failure(
                    2,
                    "several urls: add --cluster (seeds) or --sentinel-master NAME (sentinels)"
                        .into(),
                ))
            }
        }
    };
    if let Some(path) = &cli.tls_ca {
        let pem = std::fs::read(path)
            .map_err(|e| Failure(2, format!("cannot read --tls-ca {}: {e}", path.display())))?;
        builder = builder.tls_root_certificate(pem);
    }
    Ok(builder
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .pool_size(2)
        .min_idle(Some(0))
        .build()?)
}

fn force_unlock(
    client: &Client,
    name: &str,
    yes: bool,
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let found = client.inspect(name)?;
    if !matches!(
        found.kind,
        ObjectKind::Lock
            | ObjectKind::FencedLock
            | ObjectKind::FairLock
            | ObjectKind::ReadWriteLock
    ) {
        return Err(Failure(
            NOTHING,
            match found.kind {
                ObjectKind::Missing => format!("nothing to unlock: {name:?} is not held"),
                kind => format!(
                    "nothing to unlock: {name:?} is a {}, not a lock",
                    kind.as_str()
                ),
            },
        ));
    }
    if found.holders.is_empty() {
        return Err(Failure(
            NOTHING,
            format!("nothing to unlock: {name:?} is not held"),
        ));
    }
    if !yes {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return Err(Failure(
                NOT_CONFIRMED,
                "not confirmed: pass --yes to force-unlock without a terminal to ask on".into(),
            ));
        }
        eprint!("{}", inspection_text(&found));
        eprint!("Delete {name:?}, whoever holds it? The holders lose it at once. [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = stdin.lock().read_line(&mut answer);
        if !answer.trim().eq_ignore_ascii_case("y") && !answer.trim().eq_ignore_ascii_case("yes") {
            return Err(Failure(NOT_CONFIRMED, "not confirmed: nothing done".into()));
        }
        // The answer took a human's time: the holders shown may have let go
        // and another taken it. Delete only what was confirmed.
        let now = client.inspect(name)?;
        let owners = |i: &Inspection| {
            let mut o: Vec<String> = i.holders.iter().map(|h| h.owner.clone()).collect();
            o.sort();
            o
        };
        if now.kind != found.kind || owners(&now) != owners(&found) {
            return Err(Failure(
                NOT_CONFIRMED,
                format!(
                    "not confirmed: the holders of {name:?} changed while you were asked, nothing done"
                ),
            ));
        }
    }
    let deleted = match found.kind {
        ObjectKind::FairLock => client.fair_lock(name).force_unlock()?,
        ObjectKind::ReadWriteLock => client.read_write_lock(name).force_unlock()?,
        _ => client.lock(name).force_unlock()?,
    };
    if json {
        emit(
            out,
            &json_text(&json!({ "name": name, "unlocked": deleted })),
        )?;
    } else if deleted {
        emit(out, &format!("unlocked {}\n", clean(name)))?;
    }
    if deleted {
        Ok(())
    } else {
        Err(Failure(
            NOTHING,
            format!("nothing to unlock: {name:?} was released meanwhile"),
        ))
    }
}

fn watch(
    client: &Client,
    pattern: &str,
    interval: f64,
    count: Option<u64>,
    json: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let interval = seconds("--interval", interval)?;
    let tty = std::io::stdout().is_terminal();
    // The longest lease seen per name: the bar's full width.
    let mut longest: std::collections::HashMap<String, Duration> = Default::default();
    let mut n = 0u64;
    // Since when Redis cannot be reached (watch keeps going meanwhile).
    let mut down_since: Option<SystemTime> = None;
    loop {
        let found = match client.list(pattern) {
            Ok(found) => {
                down_since = None;
                Some(found)
            }
            // Bad input or credentials: waiting will not help.
            Err(e) if e.is_invalid_argument() || e.is_auth() => return Err(e.into()),
            Err(e) => {
                let since = *down_since.get_or_insert_with(SystemTime::now);
                let Failure(_, message) = e.into();
                let line = format!(
                    "redis not answering since {} (now {}): {message}; retrying\n",
                    clock(since),
                    clock(SystemTime::now())
                );
                if tty && !json {
                    emit(out, &format!("\x1b[2J\x1b[H{}\n", clean(line.trim_end())))?;
                } else {
                    let _ = std::io::stderr().write_all(line.as_bytes());
                }
                None
            }
        };
        if let Some(found) = found {
            emit(
                out,
                &watch_screen(&found, pattern, interval, json, tty, &mut longest),
            )?;
        }
        n += 1;
        if count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

/// One refresh of `watch`.
fn watch_screen(
    found: &[Inspection],
    pattern: &str,
    interval: Duration,
    json: bool,
    tty: bool,
    longest: &mut std::collections::HashMap<String, Duration>,
) -> String {
    {
        if json {
            let v = Value::Array(found.iter().map(inspection_json).collect());
            format!("{v}\n")
        } else {
            let mut screen = String::new();
            if tty {
                // Clear the screen, cursor home.
                screen.push_str("\x1b[2J\x1b[H");
            }
            screen.push_str(&format!(
                "redlease watch {pattern:?}  every {interval:?}  {} object(s)  {}\n",
                found.len(),
                clock(SystemTime::now())
            ));
            for i in found {
                let lease = i.holders.iter().filter_map(|h| h.remaining_lease).max();
                let full = longest.entry(i.name.clone()).or_default();
                if let Some(l) = lease {
                    *full = (*full).max(l);
                }
                screen.push_str(&list_line(i, Some(*full)));
                screen.push('\n');
            }
            screen
        }
    }
}

fn json_text(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default() + "\n"
}

fn ms(d: Option<Duration>) -> Value {
    d.map_or(Value::Null, |d| {
        json!(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    })
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn process_json(p: &Option<ProcessInfo>) -> Value {
    p.as_ref().map_or(Value::Null, |p| {
        json!({
            "client_id": p.client_id,
            "host": p.host,
            "pid": p.pid,
            "name": p.name,
            "started_ms": epoch_ms(p.started),
            "version": p.version,
        })
    })
}

fn mode(m: HoldMode) -> &'static str {
    match m {
        HoldMode::Exclusive => "exclusive",
        HoldMode::Read => "read",
        HoldMode::Write => "write",
        HoldMode::Permits => "permits",
        _ => "other",
    }
}

fn holder_json(h: &Holder) -> Value {
    json!({
        "owner": h.owner,
        "client_id": h.client_id,
        "owner_id": h.owner_id,
        "mode": mode(h.mode),
        "count": h.count,
        "lease_ms": ms(h.remaining_lease),
        "process": process_json(&h.process),
    })
}

fn waiter_json(w: &Waiter) -> Value {
    json!({
        "owner": w.owner,
        "client_id": w.client_id,
        "owner_id": w.owner_id,
        "place_kept_ms": ms(Some(w.place_kept_for)),
        "process": process_json(&w.process),
    })
}

fn inspection_json(i: &Inspection) -> Value {
    json!({
        "name": i.name,
        "kind": i.kind.as_str(),
        "lease_ms": ms(i.remaining_lease),
        "value": i.value,
        "holders": i.holders.iter().map(holder_json).collect::<Vec<_>>(),
        "queue": i.queue.iter().map(waiter_json).collect::<Vec<_>>(),
        "waiting_processes": i.waiting_processes,
    })
}

/// `12:03:04` (UTC) of `t`.
fn clock(t: SystemTime) -> String {
    let s = epoch_ms(t) / 1000;
    format!("{:02}:{:02}:{:02} UTC", s / 3600 % 24, s / 60 % 60, s % 60)
}

fn lease_text(d: Option<Duration>) -> String {
    d.map_or("no lease".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// Which process a holder or waiter is (`None`: no process key, so not a
/// redlease client, or one that is gone).
fn process_text(process: &Option<ProcessInfo>) -> Option<String> {
    process.as_ref().map(|p| {
        let name = p
            .name
            .as_deref()
            .map(|n| format!("{n} "))
            .unwrap_or_default();
        clean(&format!("{name}pid {} on {}", p.pid, p.host)).into_owned()
    })
}

/// Who a holder or waiter is: its process when known, else its owner field.
fn who(owner: &str, process: &Option<ProcessInfo>) -> String {
    process_text(process).unwrap_or_else(|| clean(owner).into_owned())
}

/// A holder's or waiter's process in full, or why there is none.
fn process_detail(process: &Option<ProcessInfo>) -> String {
    match process {
        Some(p) => format!(
            "{}, since {} (redlease {})",
            process_text(process).unwrap_or_default(),
            clock(p.started),
            clean(&p.version)
        ),
        None => "no process key (not a redlease client, or gone)".to_owned(),
    }
}

fn inspection_text(i: &Inspection) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mut s = format!("{}  {}", clean(&i.name), clean(i.kind.as_str()));
    if i.remaining_lease.is_some() {
        s.push_str(&format!("  lease {} left", lease_text(i.remaining_lease)));
    }
    match (&i.kind, i.value) {
        (ObjectKind::FencedLock, Some(v)) => s.push_str(&format!("  last token {v}")),
        (_, Some(v)) => s.push_str(&format!("  value {v}")),
        _ => {}
    }
    let _ = writeln!(out, "{s}");
    for h in &i.holders {
        let _ = writeln!(
            out,
            "  holder  {}  {} x{}  lease {}  {}",
            clean(&h.owner),
            mode(h.mode),
            h.count,
            lease_text(h.remaining_lease),
            process_detail(&h.process)
        );
    }
    for (n, w) in i.queue.iter().enumerate() {
        let _ = writeln!(
            out,
            "  waiter {}  {}  place kept {:.1} s  {}",
            n + 1,
            clean(&w.owner),
            w.place_kept_for.as_secs_f64(),
            process_detail(&w.process)
        );
    }
    if i.waiting_processes > 0 {
        let _ = writeln!(out, "  {} process(es) waiting", i.waiting_processes);
    }
    out
}

/// One line of `list` and `watch`: name, kind, first holder, the lease
/// (with a bar against `full`, in `watch`), waiters.
fn list_line(i: &Inspection, full: Option<Duration>) -> String {
    let lease = i.holders.iter().filter_map(|h| h.remaining_lease).max();
    let lock = matches!(
        i.kind,
        ObjectKind::Lock
            | ObjectKind::FencedLock
            | ObjectKind::FairLock
            | ObjectKind::ReadWriteLock
    );
    let holder = match i.holders.as_slice() {
        [] if lock => "free".to_owned(),
        [] => String::new(),
        [h] => format!("{} x{}", who(&h.owner, &h.process), h.count),
        [h, rest @ ..] => format!(
            "{} x{} +{} more",
            who(&h.owner, &h.process),
            h.count,
            rest.len()
        ),
    };
    let bar = match full {
        Some(full) if !full.is_zero() => {
            const WIDTH: usize = 20;
            let left = lease.unwrap_or_default().as_secs_f64() / full.as_secs_f64();
            let filled = ((left * WIDTH as f64).round() as usize).min(WIDTH);
            format!("[{}{}] ", "#".repeat(filled), ".".repeat(WIDTH - filled))
        }
        _ => String::new(),
    };
    let waiting = match (i.queue.len(), i.waiting_processes) {
        (0, 0) => String::new(),
        (0, p) => format!("  {p} process(es) waiting"),
        (q, _) => format!("  {q} in line"),
    };
    let value = match (&i.kind, i.value) {
        (ObjectKind::Semaphore | ObjectKind::ExpirableSemaphore | ObjectKind::Counter, Some(v)) => {
            format!("  value {v}")
        }
        _ => String::new(),
    };
    let lease = match lease {
        Some(_) => lease_text(lease),
        None => "-".to_owned(),
    };
    let line = format!(
        "{:<24} {:<19} {bar}{lease:<8} {holder}{value}{waiting}",
        clean(&i.name),
        clean(i.kind.as_str())
    );
    line.trim_end().to_owned()
}
