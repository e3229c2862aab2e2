//! A future run inside a `tracing` span, like `tracing::Instrument::instrument`, but without the
//! span entered once more to drop the future after it has finished.
//!
//! `tracing`'s `Instrumented` enters its span on every poll, and again in its `Drop`, so that
//! whatever the inner future's destructor logs is in the span. For a future that ran to the end
//! (every `.await` on the hot path) that last enter drops an async state machine with nothing
//! left in it: a registry push and pop, a span lookup per layer with a per-layer filter, the
//! filters' own enter and exit hooks. With trace export on, a quarter of the span enters of an
//! operation were these (measured with `bench http`, export on). [`InSpan`] drops the inner
//! future inside the poll that finished it, while the span is entered anyway, so its own drop has
//! nothing to do. A future dropped before it finished (cancelled, or its task aborted) is still
//! dropped inside the span, as with `Instrumented`.
//!
//! It must never be a way to run a future outside its span: every poll and every drop of the
//! inner future happens with the span entered.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tracing::Span;

pin_project_lite::pin_project! {
    /// A future that runs `F` inside `span`: see the module documentation.
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    #[derive(Debug)]
    pub struct InSpan<F> {
        // `None` once `F` has finished: it was dropped inside the poll that finished it. `Option`
        // and `Pin::set` are what let that drop be written without `unsafe` (`Instrumented` keeps
        // a `ManuallyDrop` for the same end, which the domain's `forbid(unsafe_code)` rules out).
        #[pin]
        inner: Option<F>,
        span: Span,
    }

    impl<F> PinnedDrop for InSpan<F> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Finished futures were dropped already: nothing to enter the span for.
            if this.inner.is_some() {
                let _entered = this.span.enter();
                let mut inner = this.inner;
                inner.set(None);
            }
        }
    }
}

impl<F: Future> Future for InSpan<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let _entered = this.span.enter();
        let mut slot = this.inner;
        let inner = slot
            .as_mut()
            .as_pin_mut()
            .expect("an InSpan future is not polled again after it has finished");
        let output = std::task::ready!(inner.poll(cx));
        // Dropped here, with the span still entered: its drop is what `Instrumented` would enter
        // the span once more for.
        slot.set(None);
        Poll::Ready(output)
    }
}

/// `.in_span(span)` on any future: see [`InSpan`]. The hot path's replacement for
/// `tracing::Instrument::instrument`; `.in_span(Span::current())` replaces `in_current_span`.
pub trait InSpanExt: Future + Sized {
    /// Runs `self` inside `span`, dropping it inside the span as soon as it has finished.
    fn in_span(self, span: Span) -> InSpan<Self> {
        InSpan {
            inner: Some(self),
            span,
        }
    }
}

impl<F: Future> InSpanExt for F {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing::span;
    use tracing::subscriber::Subscriber;

    /// A subscriber that counts enters and records, for each drop of a [`Noted`] future, which
    /// span was current: enough to tell "inside the span" from "outside" without a registry.
    #[derive(Clone, Default)]
    struct Watch {
        state: Arc<Mutex<Watched>>,
    }

    #[derive(Default)]
    struct Watched {
        next_id: u64,
        stack: Vec<u64>,
        enters: u64,
        dropped_in: Vec<Option<u64>>,
    }

    impl Subscriber for Watch {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
            let mut state = self.state.lock().expect("test lock");
            state.next_id += 1;
            span::Id::from_u64(state.next_id)
        }
        fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
        fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {
            let mut state = self.state.lock().expect("test lock");
            let current = state.stack.last().copied();
            state.dropped_in.push(current);
        }
        fn enter(&self, id: &span::Id) {
            let mut state = self.state.lock().expect("test lock");
            state.enters += 1;
            state.stack.push(id.into_u64());
        }
        fn exit(&self, id: &span::Id) {
            let mut state = self.state.lock().expect("test lock");
            let popped = state.stack.pop();
            assert_eq!(
                popped,
                Some(id.into_u64()),
                "spans exit in the order entered"
            );
        }
    }

    /// Logs one line when dropped (the line's span is what the test looks at); pending for
    /// `pending_polls` polls, then ready.
    struct Noted {
        pending_polls: u32,
    }

    impl Future for Noted {
        type Output = u32;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<u32> {
            if self.pending_polls == 0 {
                return Poll::Ready(7);
            }
            self.pending_polls -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    impl Drop for Noted {
        fn drop(&mut self) {
            tracing::info!("inner future dropped");
        }
    }

    fn poll_once<F: Future + Unpin>(future: &mut F) -> Poll<F::Output> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        Pin::new(future).poll(&mut cx)
    }

    #[test]
    fn a_finished_future_is_dropped_inside_its_span_and_the_span_is_entered_once_per_poll() {
        let watch = Watch::default();
        tracing::subscriber::with_default(watch.clone(), || {
            let span = tracing::info_span!("send");
            let span_id = span.id().expect("the span is enabled").into_u64();
            let mut future = Box::pin(Noted { pending_polls: 2 }.in_span(span));
            assert!(poll_once(&mut future).is_pending());
            assert!(poll_once(&mut future).is_pending());
            assert_eq!(poll_once(&mut future), Poll::Ready(7));
            drop(future);
            let state = watch.state.lock().expect("test lock");
            assert_eq!(state.enters, 3, "three polls, no enter for the drop");
            assert_eq!(state.dropped_in, vec![Some(span_id)]);
        });
    }

    #[test]
    fn a_future_dropped_before_it_finished_is_dropped_inside_its_span() {
        let watch = Watch::default();
        tracing::subscriber::with_default(watch.clone(), || {
            let span = tracing::info_span!("send");
            let span_id = span.id().expect("the span is enabled").into_u64();
            let mut future = Box::pin(Noted { pending_polls: 5 }.in_span(span));
            assert!(poll_once(&mut future).is_pending());
            drop(future);
            let state = watch.state.lock().expect("test lock");
            assert_eq!(state.enters, 2, "one poll and the drop");
            assert_eq!(state.dropped_in, vec![Some(span_id)]);
            assert!(state.stack.is_empty());
        });
    }

    #[test]
    fn tracings_own_instrumented_enters_once_more_to_drop_a_finished_future() {
        // What `InSpan` saves, checked against `tracing` itself so the test above cannot pass
        // by counting wrong.
        use tracing::Instrument;
        let watch = Watch::default();
        tracing::subscriber::with_default(watch.clone(), || {
            let mut future =
                Box::pin(Noted { pending_polls: 2 }.instrument(tracing::info_span!("send")));
            for _ in 0..2 {
                assert!(poll_once(&mut future).is_pending());
            }
            assert_eq!(poll_once(&mut future), Poll::Ready(7));
            drop(future);
            assert_eq!(watch.state.lock().expect("test lock").enters, 4);
        });
    }
}
