//! A single-threaded executor whose only choice — which task runs next — is the seed's.
//!
//! Each task is one boxed future of the real engine (a worker's drive, a caller's record and
//! execute, a person's review). A task is runnable when it was woken (it yielded at a port
//! call, or the drive it waited for ended) or its sleep is over; the scheduler picks among the
//! runnable ones with the seeded generator. Dropping the executor's tasks is a crash: every
//! future stops where it was, between two awaits.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use crate::clock::SimClock;

/// A task's number, unique within a run.
pub type TaskId = u64;

/// What a task is, for the trace and for the scheduler's bookkeeping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskKind {
    /// A worker of process `process` drives operation `op` (its index in the run).
    Drive {
        /// The process.
        process: usize,
        /// The operation's index.
        op: usize,
    },
    /// A caller records operation `op` and executes it through process `process`.
    Client {
        /// The process.
        process: usize,
        /// The operation's index.
        op: usize,
    },
    /// A person approves or denies operation `op` through process `process`.
    Approval {
        /// The process.
        process: usize,
        /// The operation's index.
        op: usize,
    },
    /// A person decides about operation `op` through process `process`.
    Review {
        /// The process.
        process: usize,
        /// The operation's index.
        op: usize,
    },
}

impl TaskKind {
    /// The process the task runs in.
    pub fn process(&self) -> usize {
        match self {
            Self::Drive { process, .. }
            | Self::Client { process, .. }
            | Self::Approval { process, .. }
            | Self::Review { process, .. } => *process,
        }
    }
}

impl std::fmt::Display for TaskKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Drive { process, op } => write!(f, "drive op{op}@p{process}"),
            Self::Client { process, op } => write!(f, "client op{op}@p{process}"),
            Self::Approval { process, op } => write!(f, "approval op{op}@p{process}"),
            Self::Review { process, op } => write!(f, "review op{op}@p{process}"),
        }
    }
}

/// How a task ended: a one-line summary for the trace.
pub type TaskEnd = String;

type BoxedTask = Pin<Box<dyn Future<Output = TaskEnd> + Send>>;

struct Flag(AtomicBool);

impl Wake for Flag {
    fn wake(self: Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.store(true, Ordering::Relaxed);
    }
}

struct Task {
    kind: TaskKind,
    future: BoxedTask,
    woken: Arc<Flag>,
    waker: Waker,
    /// Waiting for the clock to reach this time.
    sleeping_until: Option<i64>,
}

/// The tasks of a run.
#[derive(Default)]
pub struct Executor {
    tasks: BTreeMap<TaskId, Task>,
    next_id: TaskId,
}

/// What one poll of a task came to.
pub enum Polled {
    /// It finished, with this summary.
    Finished(TaskKind, TaskEnd),
    /// It waits (for a port call to go on, for time, or for another drive).
    Waiting,
}

impl Executor {
    /// Adds a task; it is runnable at once.
    pub fn spawn(
        &mut self,
        kind: TaskKind,
        future: impl Future<Output = TaskEnd> + Send + 'static,
    ) -> TaskId {
        let id = self.next_id;
        self.next_id += 1;
        let woken = Arc::new(Flag(AtomicBool::new(true)));
        let waker = Waker::from(Arc::clone(&woken));
        self.tasks.insert(
            id,
            Task {
                kind,
                future: Box::pin(future),
                woken,
                waker,
                sleeping_until: None,
            },
        );
        id
    }

    /// The tasks that can make progress at `now_ms`, in id order.
    pub fn runnable(&self, now_ms: i64) -> Vec<TaskId> {
        self.tasks
            .iter()
            .filter(|(_, task)| {
                task.woken.0.load(Ordering::Relaxed)
                    || task.sleeping_until.is_some_and(|until| until <= now_ms)
            })
            .map(|(id, _)| *id)
            .collect()
    }

    /// The earliest time a sleeping task wakes.
    pub fn next_wake_ms(&self) -> Option<i64> {
        self.tasks
            .values()
            .filter_map(|task| task.sleeping_until)
            .min()
    }

    /// Polls task `id` once.
    pub fn poll(&mut self, id: TaskId, clock: &SimClock) -> Polled {
        let Some(task) = self.tasks.get_mut(&id) else {
            return Polled::Waiting;
        };
        task.woken.0.store(false, Ordering::Relaxed);
        task.sleeping_until = None;
        clock.take_last_sleep();
        let mut context = Context::from_waker(&task.waker);
        match task.future.as_mut().poll(&mut context) {
            Poll::Ready(end) => {
                let task = self.tasks.remove(&id).expect("the task just polled");
                Polled::Finished(task.kind, end)
            }
            Poll::Pending => {
                task.sleeping_until = clock.take_last_sleep();
                Polled::Waiting
            }
        }
    }

    /// The kind of task `id`.
    pub fn kind(&self, id: TaskId) -> Option<&TaskKind> {
        self.tasks.get(&id).map(|task| &task.kind)
    }

    /// Whether any task is left.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// How many tasks are left.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Drops every task of `process` where it stands (a crash); returns their kinds.
    pub fn kill_process(&mut self, process: usize) -> Vec<TaskKind> {
        let doomed: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(_, task)| task.kind.process() == process)
            .map(|(id, _)| *id)
            .collect();
        doomed
            .into_iter()
            .filter_map(|id| self.tasks.remove(&id).map(|task| task.kind))
            .collect()
    }
}
