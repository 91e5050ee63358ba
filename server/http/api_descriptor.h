// The API's .proto files (proto/oomb/v1/jobs.proto, datasets.proto and what they import) as a
// google.protobuf.FileDescriptorSet with their comments (protoc --include_source_info), embedded
// in the binary when it is built (cmake/EmbedFile.cmake): what the OpenAPI document
// (server/http/openapi.h) describes its paths and schemas with. The generated code's descriptors
// carry no comments.
#ifndef OOMB_SERVER_HTTP_API_DESCRIPTOR_H_
#define OOMB_SERVER_HTTP_API_DESCRIPTOR_H_

#include "absl/strings/string_view.h"

namespace oomb::server {

// The serialized FileDescriptorSet, dependencies before the files that import them.
absl::string_view ApiDescriptorSet();

}  // namespace oomb::server

#endif  // OOMB_SERVER_HTTP_API_DESCRIPTOR_H_
