// The bytes of TensorBoard's event files (lockstep/summary.h): TFRecord framing with masked
// CRC-32C, and the few tensorflow.Event protobuf messages SummaryWriter writes. Internal: the
// writer and its tests use it. Not here: files, queues, threads (summary_writer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lockstep::io::tfevents {

// CRC-32C (Castagnoli), as TFRecord uses; crc32c("123456789") == 0xE3069283.
uint32_t crc32c(std::string_view data);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view data);
// One TFRecord: uint64 length (little-endian), masked CRC-32C of those 8 bytes, the data, masked
// CRC-32C of the data.
std::string frame_record(std::string_view data);

// Serialized tensorflow.Event messages, fields in field-number order (as protobuf writes them).
// wall_time and step are left out when 0 (proto3 defaults), as protobuf does.
// {wall_time, step, file_version: "brain.Event:2"}
std::string file_version_event(double wall_time, int64_t step = 0);
// {wall_time, step, session_log {status: START}}: TensorBoard discards earlier events at `step`
// and after (purge_step).
std::string session_start_event(double wall_time, int64_t step);
// {wall_time, step, summary {value {tag, simple_value}}}
std::string scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
// {wall_time, step, summary {value {tag, tensor {dtype: DT_STRING, tensor_shape {dim {size: 1}},
//  string_val: text}, metadata {plugin_data {plugin_name: "text"}}}}}, as PyTorch's text().
std::string text_event(double wall_time, int64_t step, std::string_view tag, std::string_view text);

}  // namespace lockstep::io::tfevents
