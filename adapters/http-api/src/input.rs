//! Inputs the API and the CLI both parse, with one set of rules and one error text.

use opledger_domain::error::ValidationError;

/// The longest duration a filter takes: a hundred years.
const MAX_DURATION_DAYS: i64 = 100 * 365;

/// Parses `10s`, `10m`, `2h`, `3d` (a positive whole number and one unit).
pub fn parse_duration(flag: &str, text: &str) -> Result<chrono::Duration, ValidationError> {
    let text = text.trim();
    let invalid = |why: &str| {
        ValidationError::new(
            flag,
            format!(
                "`{text}` {why}; write a whole number and a unit s, m, h or d, e.g. 10m, 2h, 3d"
            ),
        )
    };
    let split = text
        .char_indices()
        .last()
        .map(|(index, _)| index)
        .ok_or_else(|| invalid("is empty"))?;
    let (number, unit) = text.split_at(split);
    let seconds_per_unit: i64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(invalid("has no unit")),
    };
    let amount: i64 = number
        .parse()
        .map_err(|_| invalid("does not start with a whole number"))?;
    if amount <= 0 {
        return Err(invalid("is not positive"));
    }
    let seconds = amount
        .checked_mul(seconds_per_unit)
        .filter(|seconds| *seconds <= MAX_DURATION_DAYS * 86_400)
        .ok_or_else(|| invalid(&format!("is longer than {MAX_DURATION_DAYS} days")))?;
    Ok(chrono::Duration::seconds(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_a_number_and_one_unit() {
        assert_eq!(
            parse_duration("--older-than", "10m").map(|d| d.num_seconds()),
            Ok(600)
        );
        assert_eq!(
            parse_duration("--older-than", "3d").map(|d| d.num_seconds()),
            Ok(259_200)
        );
        for bad in [
            "",
            "10",
            "m",
            "-5m",
            "0s",
            "1.5h",
            "10x",
            "99999999999d",
            "5 m",
        ] {
            let error = parse_duration("--older-than", bad).expect_err(bad);
            assert_eq!(error.field, "--older-than", "{bad}");
        }
    }
}
