//! Memory: the pool's and the spill directory's default sizes, and what a batch held in memory
//! is counted as.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;
use datafusion::error::Result as DFResult;

/// The memory pool's size when none is configured: 60% of what this process may use (the
/// cgroup limit in a container, else physical memory), leaving room for caches and the
/// allocator, so a heavy query spills or fails instead of the container being OOM-killed.
pub fn default_memory_limit() -> usize {
    let physical = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<usize>().ok())
        })
        .map(|kb| kb * 1024);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok());
    let total = match (physical, cgroup) {
        (Some(p), Some(c)) => p.min(c),
        (Some(p), None) => p,
        (None, Some(c)) => c,
        (None, None) => 4 << 30,
    };
    total / 10 * 6
}

/// Half of the space free in `dir` (1 GiB when it cannot be read): what spilling may use by
/// default, so that queries never fill the disk the process and its caches live on.
pub fn default_spill_bytes(dir: &std::path::Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else { return 1 << 30 };
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a buffer statvfs fills.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return 1 << 30;
    }
    let free = (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64);
    usize::try_from(free / 2).unwrap_or(usize::MAX)
}

/// The memory a batch's rows take. Aggregations emit slices of one large array, and every
/// slice reports the whole array in `get_array_memory_size`. A string view array reports every
/// buffer it points into, and after a sort or a concatenation that is all of its sources'
/// buffers (one window batch reported gigabytes): it counts its views and the bytes they use.
pub fn batch_bytes(batch: &RecordBatch) -> usize {
    batch
        .columns()
        .iter()
        .map(|c| match c.data_type() {
            DataType::Utf8View => view_size(c.as_string_view().views(), c.nulls()),
            DataType::BinaryView => view_size(c.as_binary_view().views(), c.nulls()),
            _ => c.to_data().get_slice_memory_size().unwrap_or_else(|_| c.get_array_memory_size()),
        })
        .sum()
}

/// `batch` as slices of at most `size` rows (zero-copy).
pub fn slices(batch: &RecordBatch, size: usize) -> Vec<RecordBatch> {
    if batch.num_rows() <= size {
        return vec![batch.clone()];
    }
    (0..batch.num_rows()).step_by(size).map(|at| batch.slice(at, size.min(batch.num_rows() - at))).collect()
}

/// A view holds strings of up to 12 bytes itself; a longer one points at its bytes elsewhere.
fn view_size(views: &[u128], nulls: Option<&NullBuffer>) -> usize {
    views.len() * 16 + outside(views) + nulls.map_or(0, |n| n.len().div_ceil(8))
}

fn outside(views: &[u128]) -> usize {
    views.iter().map(|v| *v as u32 as usize).filter(|&len| len > 12).sum()
}

/// Copies the strings of each view column whose buffers hold more than twice the bytes its
/// views use into buffers of its own. A batch that is kept (a shared subquery's rows) or
/// gathered (a window's) would otherwise keep whole decoded pages alive for the few strings a
/// filter let through, or list a sort's buffers once per source batch.
pub fn compact_views(batch: RecordBatch) -> DFResult<RecordBatch> {
    let (schema, columns, rows) = batch.into_parts();
    let columns = columns.into_iter().map(compact_view_column).collect();
    let rows = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(schema, columns, &rows)?)
}

/// One column of [`compact_views`].
pub fn compact_view_column(c: ArrayRef) -> ArrayRef {
    fn wasteful(views: &[u128], buffers: &[arrow::buffer::Buffer]) -> bool {
        buffers.iter().map(|b| b.len()).sum::<usize>() > 2 * outside(views)
    }
    match c.data_type() {
        DataType::Utf8View if wasteful(c.as_string_view().views(), c.as_string_view().data_buffers()) => {
            Arc::new(c.as_string_view().gc())
        }
        DataType::BinaryView if wasteful(c.as_binary_view().views(), c.as_binary_view().data_buffers()) => {
            Arc::new(c.as_binary_view().gc())
        }
        _ => c,
    }
}

#[cfg(test)]
mod tests {
    use arrow::array::{StringViewArray, UInt32Array};
    use arrow::compute::take;

    use super::*;

    #[test]
    fn a_few_views_count_their_own_bytes_not_the_buffers_they_share() {
        let long = "x".repeat(100);
        let all: StringViewArray = (0..10_000).map(|i| Some(format!("{long}{i}"))).collect();
        let few = take(&all, &UInt32Array::from(vec![0, 5_000]), None).unwrap();
        let batch = |a| RecordBatch::try_from_iter([("s", a)]).unwrap();
        let (all, few) = (batch(Arc::new(all) as _), batch(few));
        // The two taken views still point into the whole array's buffers.
        assert!(few.get_array_memory_size() > 1_000_000);
        assert_eq!(batch_bytes(&few), 2 * 16 + 101 + 104);
        let bytes: usize = (0..10_000).map(|i| 100 + format!("{i}").len()).sum();
        assert_eq!(batch_bytes(&all), 10_000 * 16 + bytes);
        // Compacted, the few views get buffers of their own; the whole array is left alone.
        let compacted = compact_views(few).unwrap();
        assert!(compacted.get_array_memory_size() < 1_000);
        assert_eq!(compacted.column(0).as_string_view().value(1), format!("{long}5000"));
        assert_eq!(
            compact_views(all.clone()).unwrap().column(0).as_string_view().data_buffers(),
            all.column(0).as_string_view().data_buffers()
        );
        // Inline strings (12 bytes or fewer) take only their views.
        let short: StringViewArray = vec![Some("a"), None, Some("bcd")].into_iter().collect();
        assert_eq!(batch_bytes(&batch(Arc::new(short) as _)), 3 * 16 + 1);
    }
}
