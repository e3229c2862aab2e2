//! What the agent may say about an operation: one sentence that follows the state (design rule
//! 11). "Done" needs a checkable ground: only a confirmed success names an object, and it names
//! exactly the one the provider confirmed.

use crate::state::{OperationState, Status};

/// The one truthful sentence an agent may say about an operation in `state`.
///
/// ```
/// use opledger_domain::sentence::agent_sentence;
/// use opledger_domain::state::OperationState;
/// assert!(agent_sentence(&OperationState::initial()).contains("not been recorded"));
/// ```
pub fn agent_sentence(state: &OperationState) -> String {
    described_sentence(state, None)
}

/// [`agent_sentence`] in the words of the action's configured description ("create a task"),
/// naming the account: "I have recorded the request to create a task in account acct-1; …".
/// Without a description (the action is not configured here), the action's name stands in.
pub fn described_sentence(state: &OperationState, description: Option<&str>) -> String {
    if state.executed_by_caller() {
        if let Some(sentence) = step_sentence(state) {
            return sentence;
        }
    }
    let what = match (state.intent.as_ref(), description) {
        (None, _) => "the operation".to_owned(),
        (Some(intent), Some(description)) => format!(
            "the request to {} in account {}",
            description.trim().trim_end_matches('.'),
            intent.account
        ),
        (Some(intent), None) => {
            format!("the {} request", intent.action.as_str().replace('_', " "))
        }
    };
    match &state.status {
        Status::New => "This request has not been recorded, so nothing was done.".to_owned(),
        Status::AwaitingApproval => {
            format!("I have recorded {what}; it is waiting for approval and nothing has been sent yet.")
        }
        Status::Denied => format!(
            "{} was denied, so nothing was sent{}.",
            capitalize(&what),
            reason_suffix(state.last_error.as_deref())
        ),
        Status::Pending if state.attempts == 0 => {
            format!("I have recorded {what}; it has not been sent yet.")
        }
        Status::Pending | Status::InFlight => {
            format!("I am sending {what} now; the system has not confirmed it yet.")
        }
        Status::Succeeded { external_id } => {
            format!("Done: the system confirmed {what} and created object {external_id}.")
        }
        Status::Rejected => format!(
            "The system refused {what}, so nothing was created{}.",
            reason_suffix(state.last_error.as_deref())
        ),
        Status::Unknown => format!(
            "The system has not confirmed {what} yet; I am checking whether it was created. Please do not repeat it."
        ),
        Status::NeedsReview => format!(
            "I could not confirm whether {what} went through; a person is checking it now. Please do not repeat it."
        ),
        Status::Abandoned => format!("{} was cancelled after review.", capitalize(&what)),
    }
}

/// The sentences of a step the caller's own code carries out where a connector's would name a
/// system that sends and confirms: the caller runs it and reports. `None` where the common
/// sentence fits (approval, refusal, review, abandonment).
fn step_sentence(state: &OperationState) -> Option<String> {
    let intent = state.intent.as_ref()?;
    let what = format!(
        "the {} step of {}",
        intent.action.as_str().replace('_', " "),
        intent.provider
    );
    Some(match &state.status {
        Status::Pending if state.attempts == 0 => {
            format!("I have recorded {what}; it has not been run yet.")
        }
        Status::Pending => format!("I have recorded {what}; a person decided to run it again, and it has not been run since."),
        Status::InFlight => format!("{} is running now; it has not reported back yet.", capitalize(&what)),
        Status::Succeeded { external_id } => {
            format!("Done: {what} ran and reported result {external_id}.")
        }
        Status::Rejected => format!(
            "{} failed without taking effect{}.",
            capitalize(&what),
            reason_suffix(state.last_error.as_deref())
        ),
        Status::Unknown => format!(
            "{} stopped reporting, so whether it took effect is unknown; it will not be run again without a person. Please do not repeat it.",
            capitalize(&what)
        ),
        Status::NeedsReview => format!(
            "I could not confirm whether {what} took effect; a person is checking it now. Please do not repeat it."
        ),
        _ => return None,
    })
}

fn reason_suffix(reason: Option<&str>) -> String {
    reason.map_or_else(String::new, |reason| format!(" ({reason})"))
}

fn capitalize(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_uppercase().chain(chars).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{AttemptStarted, AttemptSucceeded, OperationEvent, OutcomeUnknown};
    use crate::ids::WorkerId;
    use crate::state::fold;
    use crate::testing::{at_s, external, intent};

    fn history_to(last: Option<OperationEvent>) -> OperationState {
        let attempt = crate::testing::attempt(1);
        let mut events = vec![
            OperationEvent::IntentRecorded(intent(false)),
            OperationEvent::AttemptStarted(AttemptStarted {
                request: None,
                budget_wait: None,
                attempt_id: attempt,
                attempt_number: 1,
                worker: WorkerId::new("w").expect("valid"),
                lease_deadline: at_s(30),
                at: at_s(0),
            }),
        ];
        events.extend(last);
        fold(&events)
    }

    #[test]
    fn a_success_names_exactly_the_confirmed_object() {
        let state = history_to(Some(OperationEvent::AttemptSucceeded(AttemptSucceeded {
            attempt_id: crate::testing::attempt(1),
            external_id: external("731"),
            provider_request_id: None,
            at: at_s(1),
        })));
        let sentence = agent_sentence(&state);
        assert!(
            sentence.starts_with("Done") && sentence.contains("731"),
            "{sentence}"
        );
    }

    #[test]
    fn an_unknown_outcome_never_says_done_and_asks_not_to_repeat() {
        let state = history_to(Some(OperationEvent::OutcomeUnknown(OutcomeUnknown {
            attempt_id: crate::testing::attempt(1),
            error: "timeout".into(),
            check_not_before: None,
            at: at_s(10),
        })));
        let sentence = agent_sentence(&state);
        assert!(!sentence.contains("Done"), "{sentence}");
        assert!(
            sentence.contains("not confirmed") && sentence.contains("checking"),
            "{sentence}"
        );
    }

    #[test]
    fn only_a_success_ever_says_done() {
        for state in [
            history_to(None),
            fold(&[OperationEvent::IntentRecorded(intent(true))]),
        ] {
            assert!(!agent_sentence(&state).contains("Done"));
        }
    }

    #[test]
    fn a_steps_sentence_says_its_caller_runs_it_and_only_a_reported_result_is_done() {
        let mut step = intent(false);
        step.executor = crate::event::Executor::Caller;
        let recorded = fold(&[OperationEvent::IntentRecorded(step.clone())]);
        assert!(
            agent_sentence(&recorded).contains("has not been run yet"),
            "{}",
            agent_sentence(&recorded)
        );
        let mut history = vec![
            OperationEvent::IntentRecorded(step),
            OperationEvent::AttemptStarted(AttemptStarted {
                request: None,
                budget_wait: None,
                attempt_id: crate::testing::attempt(1),
                attempt_number: 1,
                worker: WorkerId::new("caller:job").expect("valid"),
                lease_deadline: at_s(30),
                at: at_s(0),
            }),
        ];
        let running = fold(&history);
        let sentence = agent_sentence(&running);
        assert!(
            sentence.contains("is running now") && !sentence.contains("sending"),
            "{sentence}"
        );
        history.push(OperationEvent::OutcomeUnknown(OutcomeUnknown {
            attempt_id: crate::testing::attempt(1),
            error: "the caller reported: timeout".into(),
            check_not_before: None,
            at: at_s(10),
        }));
        let sentence = agent_sentence(&fold(&history));
        assert!(
            !sentence.contains("Done") && sentence.contains("do not repeat"),
            "{sentence}"
        );
        history.pop();
        history.push(OperationEvent::AttemptSucceeded(AttemptSucceeded {
            attempt_id: crate::testing::attempt(1),
            external_id: external("inv-1"),
            provider_request_id: None,
            at: at_s(1),
        }));
        let sentence = agent_sentence(&fold(&history));
        assert!(
            sentence.starts_with("Done") && sentence.contains("inv-1"),
            "{sentence}"
        );
    }

    #[test]
    fn a_described_sentence_uses_the_actions_words_and_names_the_account() {
        let state = history_to(None);
        let sentence = described_sentence(&state, Some("create a task."));
        assert!(
            sentence.starts_with("I am sending the request to create a task in account acct-1 now"),
            "{sentence}"
        );
        assert_eq!(described_sentence(&state, None), agent_sentence(&state));
    }
}
