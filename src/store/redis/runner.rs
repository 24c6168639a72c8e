//! A lane's runner: the task that holds the lane's connection while
//! anything waits on the lane, and writes, reads and times every call on it
//! (see [`super::lane`] for what travels and when); and how a request
//! reaches it (queued on a lane, which starts or wakes its runner).
//!
//! The runner is spawned on the runtime of the request that found the lane
//! idle and polls the connection's driver itself: a reply is read by the
//! task that answers it, with no hand-off to another task or thread. Each
//! time it runs it, in order:
//!
//! 1. polls the connection (being made, or its driver: every reply that is
//!    in is read; a driver that ended means the connection did, and every
//!    call still on it fails);
//! 2. hands each call that came back its answers;
//! 3. times out what is past its deadline, but only on the first run after
//!    a turn of the runtime's reactor that followed the deadline (see
//!    below);
//! 4. sends what waits (a batch of charges, every single call), starting
//!    its requests' clocks as it is written, and polls the driver again so
//!    that it leaves in this same run;
//! 5. sets one timer, for the earliest deadline.
//!
//! A deadline is judged after the replies are read, and not on the run
//! that finds it passed: that run yields (`tokio::task::yield_now`, whose
//! wake-up the runtime defers until it has polled its reactor) and the next
//! run reads again first. tokio turns the reactor and the timers together,
//! so a reply that was in the socket when a deadline passed is always read
//! before that deadline is judged. A runtime too busy to poll the runner
//! makes answers late; it never turns a reply that came in time into a
//! timeout.
//!
//! A socket belongs to the reactor of the runtime that opened it: a runner
//! on another runtime (a store shared by several) opens a new connection.

use super::batch::{self, Job, JobReply, MAX_BATCH};
use super::error::{breaks_connection, redis_error};
use super::eviction;
use super::lane::{convert, dropped, BATCHES_IN_FLIGHT, MAX_QUEUED};
use super::lane::{lock, CallReply, Lanes, Queue, Queued, QueuedCall, Request, Sender};
use super::node::Link;
use crate::error::StoreError;
use redis::{FromRedisValue, RedisResult, Value};
use smallvec::SmallVec;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

/// Spawns lane `lane`'s runner on the current runtime.
pub(super) fn spawn(lanes: Arc<Lanes>, lane: usize) {
    use tracing::instrument::WithSubscriber;
    // Made before the task: a task dropped before its first poll (a runtime
    // shutting down) still marks the lane idle.
    let runner = Runner {
        lanes,
        lane,
        link: None,
        connecting: None,
        flights: Vec::new(),
        quiet_since: None,
        failing: false,
        sleep: None,
        finished: false,
    };
    // Unconstrained: a reply must never look missing because the task used
    // up its cooperative budget on other replies; each run is bounded.
    let task = tokio::task::coop::unconstrained(run(runner));
    // Its log lines go where the caller's would.
    tokio::spawn(task.with_current_subscriber());
}

/// How a request reaches a lane's runner.
impl Lanes {
    /// A lane for a new request, locked: an idle one if any (each lane is
    /// locked once), else the last one tried.
    fn pick(&self) -> (usize, MutexGuard<'_, Queue>) {
        let n = self.lanes.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for k in 0..n - 1 {
            let lane = (first + k) % n;
            let q = lock(&self.lanes[lane].queue);
            if !q.running {
                return (lane, q);
            }
        }
        let lane = (first + n - 1) % n;
        (lane, lock(&self.lanes[lane].queue))
    }

    /// Starts lane `lane`'s runner if none serves it (on the current
    /// runtime), or wakes it if `wake`.
    fn serve(self: &Arc<Self>, lane: usize, mut q: MutexGuard<'_, Queue>, wake: bool) {
        if !std::mem::replace(&mut q.running, true) {
            drop(q);
            spawn(self.clone(), lane);
        } else if wake {
            if let Some(w) = &q.waker {
                w.wake_by_ref();
            }
        }
    }

    /// Queues `job` on a lane (an idle one if any) and starts that lane's
    /// runner if it was idle; the answer comes on the returned channel.
    /// Called inside a tokio runtime: the runner is spawned on it.
    /// Refused at once (`Backlog`) when `cap` or more wait there.
    pub(crate) fn submit(self: &Arc<Self>, job: Job, cap: usize) -> oneshot::Receiver<JobReply> {
        let (tx, rx) = oneshot::channel();
        let (lane, mut q) = self.pick();
        if q.charges.len() >= cap {
            let _ = tx.send(Err(StoreError::Backlog {
                queued: q.charges.len(),
            }));
            return rx;
        }
        q.charges.push(Queued {
            job,
            queued_at: Instant::now(),
            tx,
        });
        // A whole batch waits: it may leave beside the ones in flight; or
        // the first charge finds no batch in flight: it may leave now.
        let wake = q.charges.len() == MAX_BATCH || (q.wake_on_charge && q.charges.len() == 1);
        self.serve(lane, q, wake);
        rx
    }

    /// Queues a call on lane `lane` (`None`: an idle one if any); it leaves
    /// as soon as the lane's runner sees it.
    fn call(
        self: &Arc<Self>,
        lane: Option<usize>,
        request: Option<Request>,
        timeout: Duration,
    ) -> oneshot::Receiver<CallReply> {
        let (tx, rx) = oneshot::channel();
        let (lane, mut q) = match lane {
            Some(i) => (i, lock(&self.lanes[i].queue)),
            None => self.pick(),
        };
        if q.calls.len() >= MAX_QUEUED {
            let _ = tx.send(Err(StoreError::Backlog {
                queued: q.calls.len(),
            }));
            return rx;
        }
        q.calls.push(QueuedCall {
            request,
            timeout,
            queued_at: Instant::now(),
            tx,
        });
        self.serve(lane, q, true);
        rx
    }

    /// Runs `request` on a lane within `budget` (from when it is written,
    /// or queued while the store fails), connecting first if need be.
    pub(crate) async fn run<T: FromRedisValue>(
        self: &Arc<Self>,
        request: Request,
        budget: Duration,
    ) -> Result<T, StoreError> {
        let reply = self.call(None, Some(request), budget).await;
        convert(reply.unwrap_or_else(|_| Err(dropped()))?)
    }

    /// Opens every lane's connection (one attempt each, within the connect
    /// timeout); the first failure is returned once all have tried.
    pub(crate) async fn connect(self: &Arc<Self>) -> Result<(), StoreError> {
        let mut result = Ok(());
        for i in 0..self.lanes.len() {
            let opened = self.call(Some(i), None, self.node.connect_timeout()).await;
            result = result.and(opened.unwrap_or_else(|_| Err(dropped())).map(drop));
        }
        result
    }
}

async fn run(mut runner: Runner) {
    // Every request that is ready to run joins the first batch, and the
    // reactor turns first: a connection the server closed while the lane
    // was idle is seen closed before anything is written on it.
    tokio::task::yield_now().await;
    runner.adopt();
    let mut judge = None;
    loop {
        match std::future::poll_fn(|cx| runner.poll(cx, judge.take())).await {
            Step::Idle => return,
            Step::Late(at) => {
                judge = Some(at);
                tokio::task::yield_now().await;
            }
        }
    }
}

/// Why a run of the runner ended.
enum Step {
    /// Nothing waits: the lane is idle.
    Idle,
    /// A deadline had passed at this instant: judged on the next run,
    /// after a reactor turn.
    Late(Instant),
}

/// A call's reply, as redis-rs delivers it.
type Reply = Pin<Box<dyn Future<Output = RedisResult<Value>> + Send>>;

/// A call written on the connection and what waits for its reply.
struct Flight {
    reply: Reply,
    waiting: Waiting,
}

enum Waiting {
    Charges(Batch),
    Call(Call),
}

/// A single call's caller.
struct Call {
    /// `None` once answered (its deadline passed).
    tx: Option<oneshot::Sender<CallReply>>,
    deadline: Instant,
    timeout: Duration,
}

/// A connection being made, and when it must be made by.
struct Connecting {
    open: Pin<Box<dyn Future<Output = Result<Link, StoreError>> + Send>>,
    deadline: Instant,
}

struct Runner {
    lanes: Arc<Lanes>,
    lane: usize,
    link: Option<Link>,
    connecting: Option<Connecting>,
    flights: Vec<Flight>,
    /// Since when calls have been out on the connection with nothing read
    /// from it (no reply, nor any part of one: a large reply that is still
    /// coming in shows the server answers).
    quiet_since: Option<Instant>,
    /// Whether the lane's last call failed (see [`Queue::failing`]).
    failing: bool,
    sleep: Option<Pin<Box<Sleep>>>,
    /// Whether the runner left the lane idle itself.
    finished: bool,
}

/// The most passes of one run (read, send, write, read again), so that a
/// stream of new calls cannot keep the runner from yielding.
const PASSES: usize = 4;

impl Runner {
    /// Takes the lane's connection, unless it was opened on another runtime.
    fn adopt(&mut self) {
        let mut q = lock(&self.lanes.lanes[self.lane].queue);
        let here = tokio::runtime::Handle::current().id();
        self.link = q.link.take().filter(|link| link.runtime == here);
        self.failing = q.failing;
    }

    fn poll(&mut self, cx: &mut Context<'_>, mut judge: Option<Instant>) -> Poll<Step> {
        let mut queued_deadline = None;
        for pass in 1..=PASSES {
            let mut progress = self.poll_connection(cx);
            progress |= self.poll_flights(cx, 0);
            let now = Instant::now();
            if let Some(at) = judge.take() {
                self.judge(at);
                progress = true;
            }
            match self.send(cx, now) {
                None => return Poll::Ready(Step::Idle),
                Some((sent, deadline)) => {
                    queued_deadline = deadline;
                    progress |= sent;
                }
            }
            if !progress {
                break;
            }
            if pass == PASSES {
                // More to do: after the other tasks' turn.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        let now = Instant::now();
        let Some(next) = self.earliest().into_iter().chain(queued_deadline).min() else {
            return Poll::Pending;
        };
        if next <= now {
            return Poll::Ready(Step::Late(now));
        }
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
        if sleep.deadline() != next {
            sleep.as_mut().reset(next);
        }
        if sleep.as_mut().poll(cx).is_ready() {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }

    /// Polls the connection being made, then the driver (which writes what
    /// was queued and reads every reply that is in). Whether either changed.
    fn poll_connection(&mut self, cx: &mut Context<'_>) -> bool {
        let mut changed = false;
        if let Some(connecting) = &mut self.connecting {
            if let Poll::Ready(opened) = connecting.open.as_mut().poll(cx) {
                self.connecting = None;
                changed = true;
                match opened {
                    Ok(link) => self.link = Some(link),
                    Err(e) => {
                        self.failing = true;
                        self.fail_queued(&e);
                    }
                }
            }
        }
        if let Some(link) = &mut self.link {
            let ended = link.driver.as_mut().poll(cx).is_ready();
            if link.heard() && self.quiet_since.is_some() {
                // Part of a reply came in: the server is answering.
                self.quiet_since = Some(Instant::now());
            }
            if ended {
                // The connection ended (the server closed it, an I/O
                // error): every call still on it fails as its reply
                // channel closes.
                self.link = None;
                changed = true;
            }
        }
        changed
    }

    /// Answers the calls from `first` on that came back; whether any did.
    fn poll_flights(&mut self, cx: &mut Context<'_>, first: usize) -> bool {
        let mut landed = false;
        let mut i = first;
        while i < self.flights.len() {
            match self.flights[i].reply.as_mut().poll(cx) {
                Poll::Pending => i += 1,
                Poll::Ready(reply) => {
                    let flight = self.flights.swap_remove(i);
                    self.land(flight.waiting, reply);
                    landed = true;
                }
            }
        }
        landed
    }

    /// Hands a call's reply to what waits for it.
    fn land(&mut self, waiting: Waiting, reply: RedisResult<Value>) {
        let broke = reply.as_ref().is_err_and(breaks_connection);
        self.failing = reply.is_err();
        if broke {
            self.link = None;
        } else {
            // The server answered: the connection works.
            self.quiet_since = (!self.flights.is_empty()).then(Instant::now);
        }
        match waiting {
            Waiting::Charges(batch) => {
                let answers = reply.map_err(redis_error).and_then(|v| {
                    let values = match &v {
                        Value::Array(values) => &values[..],
                        other => std::slice::from_ref(other),
                    };
                    batch::answers(values, &batch.jobs)
                });
                if answers.as_ref().is_ok_and(|a| a.iter().any(is_readonly)) {
                    // A demoted primary: the next connection finds the new
                    // one (through Sentinel), or fails again.
                    self.link = None;
                }
                batch.deliver(answers);
            }
            Waiting::Call(call) => {
                if let Some(tx) = call.tx {
                    let _ = tx.send(reply.map_err(redis_error));
                }
            }
        }
    }

    /// Times out what was past its deadline at `at`, a reactor turn ago.
    fn judge(&mut self, at: Instant) {
        let mut timed_out = false;
        for flight in &mut self.flights {
            timed_out |= flight.waiting.time_out(at);
        }
        // A call nobody waits for any more stays until its reply comes (or
        // the connection goes): only its reply shows the connection answers.
        if timed_out {
            self.failing = true;
        }
        if self.connecting.as_ref().is_some_and(|c| c.deadline <= at) {
            self.connecting = None;
            self.failing = true;
            let node = &self.lanes.node;
            let e = node.failure(&format!("not made within {:?}", node.connect_timeout()));
            self.fail_queued(&e);
        }
        let limit = self.lanes.response_timeout;
        if self.stalled_at().is_some_and(|t| t <= at) {
            // A frozen or unreachable server never closes the connection itself.
            self.lose(&StoreError::Unavailable(format!(
                "redis timed out: nothing came on the connection for {limit:?}"
            )));
        }
    }

    /// Gives the connection up, answering every call on it with `e`.
    fn lose(&mut self, e: &StoreError) {
        self.link = None;
        self.failing = true;
        self.quiet_since = None;
        for flight in self.flights.drain(..) {
            flight.waiting.fail(e);
        }
    }

    /// Answers everything queued with `e` (no connection could be made).
    fn fail_queued(&mut self, e: &StoreError) {
        let mut q = lock(&self.lanes.lanes[self.lane].queue);
        for w in q.charges.drain(..) {
            let _ = w.tx.send(Err(e.clone()));
        }
        for c in q.calls.drain(..) {
            let _ = c.tx.send(Err(e.clone()));
        }
    }

    /// Sends what waits and may leave now (connecting first if need be),
    /// its clocks starting at `now`; while the store fails, first answers
    /// the queued requests whose budget ran out, never sending them. `None`
    /// when nothing is left to do (the lane is idle now); else whether
    /// anything was sent or started, and when the next queued request's
    /// budget runs out.
    fn send(&mut self, cx: &mut Context<'_>, now: Instant) -> Option<(bool, Option<Instant>)> {
        let charging = self
            .flights
            .iter()
            .filter(|f| matches!(&f.waiting, Waiting::Charges(b) if !b.is_answered()))
            .count();
        let mut batches: SmallVec<[Batch; BATCHES_IN_FLIGHT]> = SmallVec::new();
        let calls;
        let mut started = false;
        let queued_deadline;
        {
            let mut q = lock(&self.lanes.lanes[self.lane].queue);
            queued_deadline = if self.failing {
                expire_queued(&mut q, now)
            } else {
                None
            };
            let waiting = !q.charges.is_empty() || !q.calls.is_empty();
            let mut n = charging;
            if self.link.is_some() {
                // A call whose caller gave up is never sent.
                calls = std::mem::take(&mut q.calls)
                    .into_iter()
                    .filter(|c| c.request.is_none() || !c.tx.is_closed())
                    .collect::<Vec<_>>();
                // A batch leaves when none is in flight (everything that
                // queued meanwhile goes with it), or when a whole batch
                // waits beside those in flight.
                while n < BATCHES_IN_FLIGHT
                    && !q.charges.is_empty()
                    && (n == 0 || q.charges.len() >= MAX_BATCH)
                {
                    let batch = Batch::take(&mut q.charges, now, self.failing);
                    // A batch whose callers had all given up is dropped.
                    if !batch.jobs.is_empty() {
                        batches.push(batch);
                        n += 1;
                    }
                }
            } else {
                calls = Vec::new();
                if waiting && self.connecting.is_none() {
                    self.connecting = Some(self.connect(now));
                    started = true;
                }
            }
            let idle = batches.is_empty()
                && calls.is_empty()
                && q.charges.is_empty()
                && q.calls.is_empty()
                && self.flights.is_empty()
                && self.connecting.is_none();
            if idle {
                // Idle (what waited had all been given up, or nothing
                // did): the connection waits in the lane for the next
                // runner, and the next request starts one.
                q.running = false;
                q.link = self.link.take();
                q.failing = self.failing;
                q.waker = None;
                q.wake_on_charge = false;
                self.finished = true;
                return None;
            }
            // With no batch of charges in flight, a new charge may leave
            // at once: it wakes the runner (else it waits for the reply
            // in flight, which wakes it anyway).
            q.wake_on_charge = self.link.is_some() && n == 0;
            if !q.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                q.waker = Some(cx.waker().clone());
            }
        }
        let first = self.flights.len();
        for call in calls {
            self.write_call(call, now);
        }
        for batch in batches {
            let (script, cmd) = batch::command(&batch.jobs);
            self.write(Request::Eval { script, cmd }, Waiting::Charges(batch));
        }
        let sent = self.flights.len() > first;
        if sent && first == 0 {
            self.quiet_since.get_or_insert(now);
        }
        // Each new call goes to the connection's queue now; the driver
        // writes it on the next pass.
        self.poll_flights(cx, first);
        Some((sent || started, queued_deadline))
    }

    /// Writes a single call, or answers a request for the connection.
    fn write_call(&mut self, call: QueuedCall, now: Instant) {
        let Some(request) = call.request else {
            let _ = call.tx.send(Ok(Value::Nil));
            return;
        };
        if call.tx.is_closed() {
            return;
        }
        let base = if self.failing { call.queued_at } else { now };
        let waiting = Waiting::Call(Call {
            tx: Some(call.tx),
            deadline: after(base, call.timeout),
            timeout: call.timeout,
        });
        self.write(request, waiting);
    }

    /// Puts `request` on the connection, for `waiting`.
    fn write(&mut self, request: Request, waiting: Waiting) {
        let Some(link) = &self.link else {
            return waiting.fail(&StoreError::Unavailable("no redis connection".into()));
        };
        let mut conn = link.conn.clone();
        let reply = Box::pin(async move { request.send(&mut conn).await });
        self.flights.push(Flight { reply, waiting });
    }

    /// Starts a new connection, checked for eviction on a primary.
    fn connect(&self, now: Instant) -> Connecting {
        let (node, eviction) = (self.lanes.node.clone(), self.lanes.eviction);
        let deadline = after(now, node.connect_timeout());
        let open = async move {
            let mut link = node.connect().await?;
            if let Some(check) = eviction {
                let mut conn = link.conn.clone();
                link.drive(eviction::check_eviction(check, &mut conn, node.shown()))
                    .await??;
            }
            Ok(link)
        };
        Connecting {
            open: Box::pin(open),
            deadline,
        }
    }

    /// The earliest deadline of what the runner holds: a request on the
    /// connection, the connection being made, or a connection answering
    /// nothing.
    fn earliest(&self) -> Option<Instant> {
        let requests = self.flights.iter().filter_map(|f| f.waiting.earliest());
        let connect = self.connecting.as_ref().map(|c| c.deadline);
        requests.chain(connect).chain(self.stalled_at()).min()
    }

    /// When the connection counts as stalled: calls are out on it and
    /// nothing has been read from it for the response timeout.
    fn stalled_at(&self) -> Option<Instant> {
        if self.flights.is_empty() {
            return None;
        }
        self.quiet_since
            .map(|q| after(q, self.lanes.response_timeout))
    }
}

impl Drop for Runner {
    /// Dropped mid-way (its runtime shut down, or it never ran): the lane
    /// is idle again, and what was queued is answered with an error (its
    /// senders dropped), as is what the runner held. Its connection goes
    /// with it.
    fn drop(&mut self) {
        if !self.finished {
            let mut q = lock(&self.lanes.lanes[self.lane].queue);
            q.charges.clear();
            q.calls.clear();
            q.running = false;
            q.waker = None;
            q.wake_on_charge = false;
        }
    }
}

/// `base + t`, or far away for a timeout that does not fit.
fn after(base: Instant, t: Duration) -> Instant {
    base.checked_add(t)
        .unwrap_or_else(|| base + Duration::from_secs(365 * 24 * 3600))
}

/// Answers with a timeout the queued requests whose budget ran out by
/// `now` (counted from when they were queued: the store fails); the
/// earliest budget left to run out.
fn expire_queued(q: &mut Queue, now: Instant) -> Option<Instant> {
    for w in q
        .charges
        .extract_if(.., |w| after(w.queued_at, w.job.timeout) <= now)
    {
        let _ = w.tx.send(Err(StoreError::Timeout(w.job.timeout)));
    }
    for c in q.calls.extract_if(.., |c| {
        c.request.is_some() && after(c.queued_at, c.timeout) <= now
    }) {
        let _ = c.tx.send(Err(StoreError::Timeout(c.timeout)));
    }
    let charges = q.charges.iter().map(|w| after(w.queued_at, w.job.timeout));
    let calls = q.calls.iter().map(|c| after(c.queued_at, c.timeout));
    charges.chain(calls).min()
}

fn is_readonly(answer: &JobReply) -> bool {
    answer.as_ref().is_err_and(|e| e.kind() == "readonly")
}

impl Waiting {
    /// Answers with a timeout whoever is past their deadline at `at`;
    /// whether anyone was.
    fn time_out(&mut self, at: Instant) -> bool {
        match self {
            Waiting::Charges(batch) => batch.time_out(at),
            Waiting::Call(call) => {
                if call.deadline > at {
                    return false;
                }
                call.tx.take().is_some_and(|tx| {
                    let _ = tx.send(Err(StoreError::Timeout(call.timeout)));
                    true
                })
            }
        }
    }

    /// The earliest deadline of whoever still waits.
    fn earliest(&self) -> Option<Instant> {
        match self {
            Waiting::Charges(batch) => batch.earliest(),
            Waiting::Call(call) => call.tx.as_ref().map(|_| call.deadline),
        }
    }

    /// Answers whoever still waits with `e`.
    fn fail(self, e: &StoreError) {
        match self {
            Waiting::Charges(batch) => batch.deliver(Err(e.clone())),
            Waiting::Call(call) => {
                if let Some(tx) = call.tx {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}

/// A batch of charges: its requests and, in the same order, where their
/// answers go and when their budgets run out.
#[derive(Default)]
struct Batch {
    jobs: Vec<Job>,
    /// `None` once the request was answered (its deadline passed).
    senders: Vec<Option<Sender>>,
    deadlines: Vec<Instant>,
}

impl Batch {
    /// Takes the next batch off a queue: up to [`MAX_BATCH`] requests whose
    /// callers still wait (those that gave up are never charged), each with
    /// its budget counted from `now`, or from when it was queued while the
    /// store fails.
    fn take(queue: &mut Vec<Queued>, now: Instant, failing: bool) -> Batch {
        let n = queue.len().min(MAX_BATCH);
        let mut batch = Batch {
            jobs: Vec::with_capacity(n),
            senders: Vec::with_capacity(n),
            deadlines: Vec::with_capacity(n),
        };
        for w in queue.drain(..n).filter(|w| !w.tx.is_closed()) {
            let base = if failing { w.queued_at } else { now };
            batch.deadlines.push(after(base, w.job.timeout));
            batch.jobs.push(w.job);
            batch.senders.push(Some(w.tx));
        }
        batch
    }

    fn is_answered(&self) -> bool {
        self.senders.iter().all(Option::is_none)
    }

    /// Answers with a timeout the requests past their deadline at `at`.
    fn time_out(&mut self, at: Instant) -> bool {
        let mut any = false;
        for ((tx, deadline), job) in self.senders.iter_mut().zip(&self.deadlines).zip(&self.jobs) {
            if *deadline <= at {
                if let Some(tx) = tx.take() {
                    let _ = tx.send(Err(StoreError::Timeout(job.timeout)));
                    any = true;
                }
            }
        }
        any
    }

    fn earliest(&self) -> Option<Instant> {
        self.senders
            .iter()
            .zip(&self.deadlines)
            .filter(|(tx, _)| tx.is_some())
            .map(|(_, d)| *d)
            .min()
    }

    /// Hands each request still waiting its answer, or the whole batch's error.
    fn deliver(self, answers: Result<Vec<JobReply>, StoreError>) {
        match answers {
            Ok(answers) => {
                for (tx, a) in self.senders.into_iter().zip(answers) {
                    if let Some(tx) = tx {
                        let _ = tx.send(a);
                    }
                }
            }
            Err(e) => {
                for tx in self.senders.into_iter().flatten() {
                    let _ = tx.send(Err(e.clone()));
                }
            }
        }
    }
}
