//! Runs a built example (`target/<profile>/examples/NAME`) or tool
//! (`tools/src/bin/NAME.rs`, built to `target/<profile>/NAME`) as a black box.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The path of a built example. It is (re)built once per test binary, so a
/// filtered `cargo test --test X` never runs a stale example.
pub fn example_path(name: &str) -> PathBuf {
    built(
        &["build", "--all-features", "--example", name],
        Path::new("examples").join(name),
    )
}

/// The path of a built tool of the `tower-ratelimit-tools` package, (re)built
/// once per test binary like an example.
pub fn tool_path(name: &str) -> PathBuf {
    built(
        &["build", "-p", "tower-ratelimit-tools", "--bin", name],
        PathBuf::from(name),
    )
}

/// Runs `cargo ARGS` once per test binary and returns `path` in the target
/// profile directory the tests run from.
fn built(args: &[&str], path: PathBuf) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<Vec<String>>> = std::sync::Mutex::new(Vec::new());
    // Integration tests live in target/<profile>/deps/.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if !built.contains(&args) {
        let status = Command::new(env!("CARGO")).args(&args).status().unwrap();
        assert!(status.success(), "cargo {} failed", args.join(" "));
        built.push(args);
    }
    profile_dir.join(path)
}

/// A running example server, killed on drop if still running.
pub struct Running {
    pub child: Child,
    pub addr: SocketAddr,
    pub stdout_rest: std::sync::mpsc::Receiver<String>,
}

impl Running {
    /// Starts `name` with `args` and waits for its one `listening on ADDR` line.
    pub fn start(name: &str, args: &[&str]) -> Running {
        Self::start_with_env(name, args, &[])
    }

    /// [`Running::start`] with `env` added to the environment.
    pub fn start_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Running {
        let mut child = Command::new(example_path(name))
            .args(args)
            // The demo's admin token is the test's to choose, not the shell's.
            .env_remove("TRL_ADMIN_TOKEN")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{name} printed no line within 60 s"));
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Running {
            child,
            addr,
            stdout_rest: rx,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "did not exit within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
