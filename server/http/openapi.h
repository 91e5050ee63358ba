// The OpenAPI 3.0 document of the HTTP/JSON API, generated from the same routes and descriptors
// the gateway serves (server/http/http_rules.h), so that the two cannot differ. Served at
// GET /v1/openapi.json, printed by `oombd openapi`, and committed as docs/openapi.json (a test
// holds the committed copy equal to the generated one).
//
// Shape: a path template's variables become path parameters, one per `*` of a resource name
// (`{name=projects/*/jobs/*}` is /v1/projects/{project}/jobs/{job}); the request's other
// scalar fields are query parameters; the body is the rule's body field; schemas follow the
// proto3 JSON mapping (lowerCamelCase names, int64 as strings, enums by name, Timestamp as
// date-time). Descriptions are the .proto files' comments when the descriptors carry them.
//
// Thread-safety: a pure function of the routes.
#ifndef OOMB_SERVER_HTTP_OPENAPI_H_
#define OOMB_SERVER_HTTP_OPENAPI_H_

#include <string>

#include "server/http/http_rules.h"

namespace oomb::server {

// The document, as indented JSON ending in a newline.
std::string OpenApiDocument(const HttpRoutes& routes);

}  // namespace oomb::server

#endif  // OOMB_SERVER_HTTP_OPENAPI_H_
