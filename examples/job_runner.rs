//! A job runner that never runs a job twice, however many workers race for
//! it: each worker takes the job's lock without waiting (someone else has
//! it: skip), checks the job is not done yet, runs it, marks it done, all
//! while the lock is held (`ensure_held` right before the side effect).
//!
//! ```text
//! cargo run --example job_runner
//! ```

#[path = "support/mod.rs"]
mod support;

use std::sync::{Arc, Mutex};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = support::redis_url()?;
    let client = redlease::Client::open(url)?;
    let jobs: Vec<String> = (0..10).map(|i| format!("job-{i}")).collect();
    // Stands for the job table's "done" column; each run is recorded.
    let done = Arc::new(Mutex::new(Vec::<String>::new()));

    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (client, jobs, done) = (client.clone(), jobs.clone(), Arc::clone(&done));
            std::thread::spawn(move || -> redlease::Result<()> {
                for job in &jobs {
                    let lock = client.lock(format!("example:jobs:{job}"));
                    let Some(guard) = lock.try_lock()? else {
                        continue; // another worker is on it
                    };
                    if done.lock().unwrap().contains(job) {
                        continue; // finished before we got here
                    }
                    guard.ensure_held()?; // still ours right before the work
                    println!("worker {w} runs {job}");
                    done.lock().unwrap().push(job.clone());
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker")?;
    }
    let done = done.lock().unwrap();
    println!("{} runs for {} jobs", done.len(), jobs.len());
    assert_eq!(done.len(), jobs.len(), "each job ran exactly once");
    Ok(())
}
