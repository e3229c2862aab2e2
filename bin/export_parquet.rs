//! `opledger export --format parquet`: the same rows as the NDJSON export, as Apache Parquet, so
//! DuckDB, pandas and Spark read an audit export directly.
//!
//! One row an event, the columns of an NDJSON event line; `data` and `metadata` are binary
//! columns holding the exact stored bytes (the chain is over them: a string column would invite a
//! reader to re-encode them). The NDJSON header and closing line are the footer's key-value
//! metadata (`opledger_export.header`, `opledger_export.end`, each a JSON object); a Parquet file
//! cut short has no footer and cannot be read at all. Rows are written in groups of
//! [`ROW_GROUP_EVENTS`], the part of the export's memory that grows with the batch.

use std::fs::File;
use std::sync::Arc;

use opledger_domain::chain::ChainHash;
use opledger_domain::codec;
use parquet::basic::Compression;
use parquet::data_type::{ByteArray, ByteArrayType, Int64Type};
use parquet::errors::ParquetError;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use crate::export::{ExportedEvent, Header};

/// Events buffered before a row group is written: at most ~16k events' data and metadata in
/// memory (a few MiB for operation events of under a KiB), and groups large enough for readers
/// to skip by statistics.
pub const ROW_GROUP_EVENTS: usize = 16_384;

/// The schema: the NDJSON line's members, in its order.
const SCHEMA: &str = "
message opledger_export {
  REQUIRED INT64 position;
  REQUIRED BYTE_ARRAY stream (UTF8);
  REQUIRED INT64 version;
  REQUIRED BYTE_ARRAY event_id (UTF8);
  REQUIRED BYTE_ARRAY type (UTF8);
  OPTIONAL INT64 time (TIMESTAMP(MILLIS,true));
  OPTIONAL BYTE_ARRAY chain (UTF8);
  OPTIONAL BYTE_ARRAY previous_chain (UTF8);
  REQUIRED BYTE_ARRAY data;
  REQUIRED BYTE_ARRAY metadata;
  OPTIONAL BYTE_ARRAY inclusion_proof;
  OPTIONAL BYTE_ARRAY context (UTF8);
}
";

/// Columns of the rows not yet written.
#[derive(Default)]
struct Columns {
    position: Vec<i64>,
    stream: Vec<ByteArray>,
    version: Vec<i64>,
    event_id: Vec<ByteArray>,
    event_type: Vec<ByteArray>,
    time: Optional<i64>,
    chain: Optional<ByteArray>,
    previous_chain: Optional<ByteArray>,
    data: Vec<ByteArray>,
    metadata: Vec<ByteArray>,
    /// The inclusion proof's hashes, 32 bytes each, concatenated in RFC 6962 order.
    inclusion_proof: Optional<ByteArray>,
    context: Optional<ByteArray>,
}

/// An optional column: the values present and each row's definition level (1 present, 0 null).
struct Optional<T> {
    values: Vec<T>,
    levels: Vec<i16>,
}

impl<T> Default for Optional<T> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            levels: Vec::new(),
        }
    }
}

impl<T> Optional<T> {
    fn push(&mut self, value: Option<T>) {
        self.levels.push(i16::from(value.is_some()));
        self.values.extend(value);
    }
}

/// Writes rows to a Parquet file.
pub struct ParquetSink {
    writer: SerializedFileWriter<File>,
    columns: Columns,
    rows: usize,
}

fn io(error: ParquetError) -> std::io::Error {
    std::io::Error::other(error.to_string())
}

fn text(value: &str) -> ByteArray {
    ByteArray::from(value.as_bytes().to_vec())
}

impl ParquetSink {
    pub fn new(file: File, header: &Header) -> std::io::Result<Self> {
        let schema = Arc::new(parse_message_type(SCHEMA).expect("the export's schema parses"));
        let header = serde_json::to_string(header)?;
        let properties = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_created_by(format!("opledger {}", env!("CARGO_PKG_VERSION")))
            .set_key_value_metadata(Some(vec![KeyValue::new(
                "opledger_export.header".to_owned(),
                header,
            )]))
            .build();
        let writer = SerializedFileWriter::new(file, schema, Arc::new(properties)).map_err(io)?;
        Ok(Self {
            writer,
            columns: Columns::default(),
            rows: 0,
        })
    }

    pub fn event(&mut self, exported: &ExportedEvent<'_>) -> std::io::Result<()> {
        let event = exported.event;
        let columns = &mut self.columns;
        columns.position.push(as_i64(event.position.value())?);
        columns.stream.push(text(event.stream.as_str()));
        columns.version.push(as_i64(event.version.value())?);
        columns.event_id.push(text(&event.event_id.to_string()));
        columns.event_type.push(text(&event.event_type));
        columns
            .time
            .push(exported.time.map(|time| time.timestamp_millis()));
        columns
            .chain
            .push(codec::chain_of(&event.metadata).map(|chain| text(&chain.to_hex())));
        columns.previous_chain.push(
            exported
                .previous
                .as_ref()
                .map(|chain: &ChainHash| text(&chain.to_hex())),
        );
        columns.data.push(ByteArray::from(event.data.clone()));
        columns
            .metadata
            .push(ByteArray::from(event.metadata.clone()));
        columns
            .inclusion_proof
            .push(exported.inclusion.as_ref().map(|proof| {
                ByteArray::from(proof.iter().flat_map(|hash| hash.0).collect::<Vec<u8>>())
            }));
        columns.context.push(exported.context.map(text));
        self.rows += 1;
        if self.rows >= ROW_GROUP_EVENTS {
            self.flush()?;
        }
        Ok(())
    }

    /// Writes the buffered rows as one row group.
    fn flush(&mut self) -> std::io::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let columns = std::mem::take(&mut self.columns);
        let mut group = self.writer.next_row_group().map_err(io)?;
        let mut index = 0;
        while let Some(mut column) = group.next_column().map_err(io)? {
            match index {
                0 => write_i64(&mut column, &columns.position, None),
                1 => write_bytes(&mut column, &columns.stream, None),
                2 => write_i64(&mut column, &columns.version, None),
                3 => write_bytes(&mut column, &columns.event_id, None),
                4 => write_bytes(&mut column, &columns.event_type, None),
                5 => write_i64(
                    &mut column,
                    &columns.time.values,
                    Some(&columns.time.levels),
                ),
                6 => write_bytes(
                    &mut column,
                    &columns.chain.values,
                    Some(&columns.chain.levels),
                ),
                7 => write_bytes(
                    &mut column,
                    &columns.previous_chain.values,
                    Some(&columns.previous_chain.levels),
                ),
                8 => write_bytes(&mut column, &columns.data, None),
                9 => write_bytes(&mut column, &columns.metadata, None),
                10 => write_bytes(
                    &mut column,
                    &columns.inclusion_proof.values,
                    Some(&columns.inclusion_proof.levels),
                ),
                11 => write_bytes(
                    &mut column,
                    &columns.context.values,
                    Some(&columns.context.levels),
                ),
                _ => unreachable!("the schema has twelve columns"),
            }
            .map_err(io)?;
            column.close().map_err(io)?;
            index += 1;
        }
        group.close().map_err(io)?;
        self.rows = 0;
        Ok(())
    }

    /// Writes the last rows and the footer, with the closing count beside the header.
    /// Writes the rows left and the closing record (`end`, as the NDJSON's closing line holds
    /// it) into the footer's key-value metadata.
    pub fn finish(mut self, end: &serde_json::Value) -> std::io::Result<File> {
        self.flush()?;
        self.writer.append_key_value_metadata(KeyValue::new(
            "opledger_export.end".to_owned(),
            end.to_string(),
        ));
        self.writer.into_inner().map_err(io)
    }
}

fn as_i64(value: u64) -> std::io::Result<i64> {
    i64::try_from(value)
        .map_err(|_| std::io::Error::other(format!("{value} does not fit Parquet's INT64")))
}

fn write_i64(
    column: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    values: &[i64],
    levels: Option<&[i16]>,
) -> Result<usize, ParquetError> {
    column
        .typed::<Int64Type>()
        .write_batch(values, levels, None)
}

fn write_bytes(
    column: &mut parquet::file::writer::SerializedColumnWriter<'_>,
    values: &[ByteArray],
    levels: Option<&[i16]>,
) -> Result<usize, ParquetError> {
    column
        .typed::<ByteArrayType>()
        .write_batch(values, levels, None)
}
