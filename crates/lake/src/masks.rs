//! Bitmaps of the rows a filter keeps, for filters evaluated a part at a time.

use arrow::array::{Array, AsArray};
use arrow::buffer::{BooleanBuffer, MutableBuffer};
use arrow::util::bit_util;
use datafusion::error::{DataFusionError, Result as DFResult};

/// Where a filter's answer is true (NULL is not).
pub(crate) fn truth(answers: &dyn Array) -> DFResult<BooleanBuffer> {
    let answers = answers
        .as_boolean_opt()
        .ok_or_else(|| DataFusionError::Internal("a filter whose answer is not boolean".into()))?;
    Ok(match answers.nulls() {
        Some(nulls) => answers.values() & nulls.inner(),
        None => answers.values().clone(),
    })
}

/// `rows` with its i-th set bit replaced by `bits`' i-th bit: answers computed over only the
/// rows set in `rows`, put back at those rows.
pub(crate) fn deposit(rows: &BooleanBuffer, bits: &BooleanBuffer) -> BooleanBuffer {
    let mut out = MutableBuffer::from_len_zeroed(rows.len().div_ceil(8));
    let slice = out.as_slice_mut();
    for (i, row) in rows.set_indices().enumerate() {
        if bits.value(i) {
            bit_util::set_bit(slice, row);
        }
    }
    BooleanBuffer::new(out.into(), 0, rows.len())
}

#[cfg(test)]
mod tests {
    use arrow::array::BooleanArray;

    use super::*;

    #[test]
    fn a_deposit_puts_each_answer_at_its_row() {
        let rows = BooleanBuffer::from(vec![false, true, true, false, true, false, false, true, true]);
        let bits = BooleanBuffer::from(vec![true, false, true, true, false]);
        let want = [false, true, false, false, true, false, false, true, false];
        assert_eq!(deposit(&rows, &bits).iter().collect::<Vec<_>>(), want);
    }

    #[test]
    fn null_is_not_true() {
        let answers = BooleanArray::from(vec![Some(true), None, Some(false), Some(true)]);
        assert_eq!(truth(&answers).unwrap().iter().collect::<Vec<_>>(), [true, false, false, true]);
    }
}
