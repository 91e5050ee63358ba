// The HTTP transcoder (server/http/http_rules.h) on its own: path templates (literals, `*`, `**`,
// `{field=...}`, verbs, which route wins), the query parser (repeated fields, maps, enums, int64,
// FieldMask, unknown parameters), the JSON body mapping (protobuf's JSON parser), and the HTTP
// form each method's shape gets (events, byte streams, client streams), over the API's own
// services and over services built here from a descriptor, so that every shape is tried.
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/text_format.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/api/annotations.pb.h"
#include "oomb/v1/datasets.pb.h"
#include "oomb/v1/jobs.pb.h"
#include "server/http/http_rules.h"

namespace oomb::server {
namespace {

using google::protobuf::Message;

// A library API after AIP-127's examples, with every field shape the query parser reads.
constexpr char kLibrary[] = R"pb(
  name: "test/library.proto"
  package: "test"
  syntax: "proto3"
  message_type {
    name: "Book"
    field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "title" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "page_count" number: 3 type: TYPE_INT64 label: LABEL_OPTIONAL json_name: "pageCount" }
    field { name: "genre" number: 4 type: TYPE_ENUM type_name: ".test.Genre" label: LABEL_OPTIONAL }
  }
  message_type {
    name: "Filter"
    field { name: "genre" number: 1 type: TYPE_ENUM type_name: ".test.Genre" label: LABEL_OPTIONAL }
    field { name: "min_pages" number: 2 type: TYPE_INT32 label: LABEL_OPTIONAL json_name: "minPages" }
  }
  message_type {
    name: "Request"
    field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "path" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "tags" number: 3 type: TYPE_STRING label: LABEL_REPEATED }
    field { name: "labels" number: 4 type: TYPE_MESSAGE type_name: ".test.Request.LabelsEntry" label: LABEL_REPEATED }
    field { name: "genre" number: 5 type: TYPE_ENUM type_name: ".test.Genre" label: LABEL_OPTIONAL }
    field { name: "big" number: 6 type: TYPE_INT64 label: LABEL_OPTIONAL }
    field { name: "small" number: 7 type: TYPE_INT32 label: LABEL_OPTIONAL }
    field { name: "page_size" number: 8 type: TYPE_UINT32 label: LABEL_OPTIONAL json_name: "pageSize" }
    field { name: "ratio" number: 9 type: TYPE_DOUBLE label: LABEL_OPTIONAL }
    field { name: "force" number: 10 type: TYPE_BOOL label: LABEL_OPTIONAL }
    field { name: "filter" number: 11 type: TYPE_MESSAGE type_name: ".test.Filter" label: LABEL_OPTIONAL }
    field { name: "book" number: 12 type: TYPE_MESSAGE type_name: ".test.Book" label: LABEL_OPTIONAL }
    field { name: "raw" number: 13 type: TYPE_BYTES label: LABEL_OPTIONAL }
    field { name: "sizes" number: 14 type: TYPE_INT64 label: LABEL_REPEATED }
    field {
      name: "update_mask"
      number: 15
      type: TYPE_MESSAGE
      type_name: ".google.protobuf.FieldMask"
      label: LABEL_OPTIONAL
      json_name: "updateMask"
    }
    nested_type {
      name: "LabelsEntry"
      field { name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
      field { name: "value" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL }
      options { map_entry: true }
    }
  }
  enum_type {
    name: "Genre"
    value { name: "GENRE_UNSPECIFIED" number: 0 }
    value { name: "FICTION" number: 1 }
    value { name: "POETRY" number: 2 }
  }
  dependency: "google/protobuf/field_mask.proto"
  service {
    name: "Library"
    method {
      name: "ListThings"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] { get: "/v1/things" }
      }
    }
    method {
      name: "GetBook"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] { get: "/v1/{name=shelves/*/books/*}" }
      }
    }
    method {
      name: "PublishBook"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] { post: "/v1/{name=shelves/*/books/*}:publish" body: "*" }
      }
    }
    method {
      name: "ListBooks"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] {
          get: "/v1/{name=shelves/*}/books"
          additional_bindings { get: "/v1/shelves/special/books" }
        }
      }
    }
    method {
      name: "CreateBook"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] { post: "/v1/{name=shelves/*}/books" body: "book" }
      }
    }
    method {
      name: "PutRaw"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] { put: "/v1/{name=shelves/*}/raw" body: "raw" }
      }
    }
    method {
      name: "ReadFile"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] { get: "/v1/files/{path=**}" }
      }
    }
    method {
      name: "Anything"
      input_type: ".test.Request"
      output_type: ".test.Book"
      options {
        [google.api.http] { delete: "/v1/*/count/**" }
      }
    }
  }
)pb";

class HttpRulesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    google::protobuf::FileDescriptorProto mask;
    google::protobuf::FieldMask::descriptor()->file()->CopyTo(&mask);
    ASSERT_NE(pool_.BuildFile(mask), nullptr);
    service_ = Build(kLibrary)->FindServiceByName("Library");
    ASSERT_NE(service_, nullptr);
    absl::StatusOr<HttpRoutes> routes = HttpRoutes::FromServices({service_});
    ASSERT_TRUE(routes.ok()) << routes.status();
    routes_ = std::make_unique<HttpRoutes>(*std::move(routes));
  }

  const google::protobuf::FileDescriptor* Build(const std::string& text) {
    google::protobuf::FileDescriptorProto file;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &file));
    const google::protobuf::FileDescriptor* built = pool_.BuildFile(file);
    EXPECT_NE(built, nullptr) << text;
    return built;
  }

  std::unique_ptr<Message> NewRequest() {
    return std::unique_ptr<Message>(factory_.GetPrototype(pool_.FindMessageTypeByName("test.Request"))->New());
  }

  // The method `method path` reaches, or "" when none does.
  std::string MethodOf(const std::string& method, const std::string& path) {
    std::optional<HttpMatch> m = routes_->Find(method, path);
    return m ? m->route->method->name() : "";
  }

  // Fills a test.Request through `method path` with `query` and `body`; the text form or the error.
  std::string Fill(const std::string& method, const std::string& path,
                   const std::multimap<std::string, std::string>& query, const std::string& body = "") {
    std::optional<HttpMatch> m = routes_->Find(method, path);
    if (!m) return "no route";
    std::unique_ptr<Message> request = NewRequest();
    if (absl::Status s = HttpRoutes::FillRequest(*m, query, body, request.get()); !s.ok()) {
      return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
    }
    std::string text;
    google::protobuf::TextFormat::Printer printer;
    printer.SetSingleLineMode(true);
    printer.PrintToString(*request, &text);
    return std::string(absl::StripTrailingAsciiWhitespace(text));
  }

  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_{&pool_};
  const google::protobuf::ServiceDescriptor* service_ = nullptr;
  std::unique_ptr<HttpRoutes> routes_;
};

TEST_F(HttpRulesTest, TemplatesParseIntoSegmentsVariablesAndVerb) {
  HttpRoute r;
  ASSERT_TRUE(ParsePathTemplate("/v1/{name=shelves/*/books/*}:publish", &r).ok());
  EXPECT_EQ(r.verb, "publish");
  ASSERT_EQ(r.variables, std::vector<std::string>({"name"}));
  ASSERT_EQ(r.segments.size(), 5u);
  EXPECT_EQ(r.segments[0].kind, HttpRoute::Segment::kLiteral);
  EXPECT_EQ(r.segments[0].variable, -1);
  EXPECT_EQ(r.segments[1].literal, "shelves");
  EXPECT_EQ(r.segments[1].variable, 0);
  EXPECT_EQ(r.segments[2].kind, HttpRoute::Segment::kOne);
  EXPECT_EQ(r.segments[4].kind, HttpRoute::Segment::kOne);

  HttpRoute rest;
  ASSERT_TRUE(ParsePathTemplate("/v1/files/{path=**}", &rest).ok());
  EXPECT_EQ(rest.segments.back().kind, HttpRoute::Segment::kRest);
  EXPECT_TRUE(rest.verb.empty());

  HttpRoute bare;
  ASSERT_TRUE(ParsePathTemplate("/v1/{parent}/jobs", &bare).ok());  // {parent} is {parent=*}
  EXPECT_EQ(bare.segments[1].kind, HttpRoute::Segment::kOne);
  EXPECT_EQ(bare.segments[2].literal, "jobs");

  EXPECT_EQ(ParsePathTemplate("v1/things", &r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParsePathTemplate("/v1/{name=shelves/*", &r).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HttpRulesTest, LiteralsOneSegmentAndTheRestMatch) {
  EXPECT_EQ(MethodOf("GET", "/v1/things"), "ListThings");
  EXPECT_EQ(MethodOf("GET", "/v1/things/x"), "");
  EXPECT_EQ(MethodOf("GET", "/v1/shelves/s1/books/b1"), "GetBook");
  EXPECT_EQ(MethodOf("GET", "/v1/shelves/s1/books/"), "") << "`*` matches no empty segment";
  EXPECT_EQ(MethodOf("GET", "/v1/shelves//books/b1"), "");
  EXPECT_EQ(MethodOf("GET", "/v1/shelves/s1/books/b1/more"), "");
  EXPECT_EQ(MethodOf("GET", "/v1/shelves/s1/books/b1:publish"), "") << "a verb no GET rule has";
  EXPECT_EQ(MethodOf("POST", "/v1/shelves/s1/books/b1:publish"), "PublishBook");
  EXPECT_EQ(MethodOf("POST", "/v1/shelves/s1/books/b1:unpublish"), "");
  EXPECT_EQ(MethodOf("POST", "/v1/shelves/s1/books/b1"), "") << "PublishBook needs its verb";
  EXPECT_EQ(MethodOf("DELETE", "/v1/anything/count"), "Anything") << "`**` matches nothing too";
  EXPECT_EQ(MethodOf("DELETE", "/v1/anything/count/a/b/c"), "Anything");
  EXPECT_EQ(MethodOf("DELETE", "/v1/count"), "");

  std::optional<HttpMatch> file = routes_->Find("GET", "/v1/files/a/b/c.txt");
  ASSERT_TRUE(file.has_value());
  EXPECT_EQ(file->bindings, (std::vector<std::pair<std::string, std::string>>{{"path", "a/b/c.txt"}}));
  std::optional<HttpMatch> book = routes_->Find("GET", "/v1/shelves/s1/books/b1");
  ASSERT_TRUE(book.has_value());
  EXPECT_EQ(book->bindings, (std::vector<std::pair<std::string, std::string>>{{"name", "shelves/s1/books/b1"}}));
}

TEST_F(HttpRulesTest, TheMostLiteralRouteWinsAndOtherMethodsAreKnownPaths) {
  std::optional<HttpMatch> special = routes_->Find("GET", "/v1/shelves/special/books");
  ASSERT_TRUE(special.has_value());
  EXPECT_EQ(special->route->path_template, "/v1/shelves/special/books");
  EXPECT_TRUE(special->bindings.empty());
  std::optional<HttpMatch> other = routes_->Find("GET", "/v1/shelves/s2/books");
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->route->path_template, "/v1/{name=shelves/*}/books");

  EXPECT_EQ(MethodOf("PATCH", "/v1/things"), "");
  EXPECT_TRUE(routes_->PathKnown("/v1/things")) << "405, not 404";
  EXPECT_TRUE(routes_->PathKnown("/v1/shelves/s1/books/b1:publish"));
  EXPECT_FALSE(routes_->PathKnown("/v1/nothing"));
  EXPECT_FALSE(routes_->PathKnown(""));
}

TEST(PercentDecodeTest, EscapesBecomeBytesAndMalformedOnesStay) {
  EXPECT_EQ(PercentDecode("a%20b%2Fc%3d%3D"), "a b/c==");
  EXPECT_EQ(PercentDecode("%e6%97%a5%E6%9C%AC"), "\xe6\x97\xa5\xe6\x9c\xac");
  EXPECT_EQ(PercentDecode("%00x"), std::string("\0x", 2));
  EXPECT_EQ(PercentDecode("100%"), "100%");
  EXPECT_EQ(PercentDecode("%4"), "%4");
  EXPECT_EQ(PercentDecode("%zz%4g%%41"), "%zz%4g%A");
  EXPECT_EQ(PercentDecode("%2541"), "%41") << "decoded once";
  EXPECT_EQ(PercentDecode("a+b"), "a+b") << "'+' is the transport's (form encoding), not RFC 3986's";
  EXPECT_EQ(PercentDecode(""), "");
}

TEST_F(HttpRulesTest, QueryParametersFillScalarsRepeatedFieldsMapsAndEnums) {
  EXPECT_EQ(Fill("GET", "/v1/things",
                 {{"tags", "a"},
                  {"tags", "b"},
                  {"labels[team]", "nlp"},
                  {"labels[tier]", "gold"},
                  {"genre", "POETRY"},
                  {"big", "9007199254740993"},
                  {"small", "-7"},
                  {"pageSize", "50"},
                  {"ratio", "0.25"},
                  {"force", "TRUE"},
                  {"filter.genre", "1"},
                  {"filter.minPages", "10"},
                  {"sizes", "-1"},
                  {"sizes", "9223372036854775807"},
                  {"update_mask", "title, page_count"}}),
            "tags: \"a\" tags: \"b\" labels { key: \"team\" value: \"nlp\" } labels { key: \"tier\" value: \"gold\" } "
            "genre: POETRY big: 9007199254740993 small: -7 page_size: 50 ratio: 0.25 force: true "
            "filter { genre: FICTION min_pages: 10 } sizes: -1 sizes: 9223372036854775807 "
            "update_mask { paths: \"title\" paths: \"page_count\" }");
}

TEST_F(HttpRulesTest, BadQueryParametersAreInvalidArgumentNamingThem) {
  const auto fails = [&](const std::string& name, const std::string& value, const std::string& says) {
    const std::string got = Fill("GET", "/v1/things", {{name, value}});
    EXPECT_TRUE(absl::StartsWith(got, "INVALID_ARGUMENT: ")) << name << "=" << value << ": " << got;
    EXPECT_NE(got.find(says), std::string::npos) << name << "=" << value << ": " << got;
  };
  fails("colour", "red", "colour: no such field");
  fails("filter.colour", "red", "filter.colour: no such field");
  fails("genre", "JAZZ", "genre: expected enum, got 'JAZZ'");
  fails("genre", "7", "genre: expected enum");
  fails("small", "2147483648", "small: expected int32");
  fails("big", "9223372036854775808", "big: expected int64");
  fails("big", "12abc", "big: expected int64");
  fails("page_size", "-1", "page_size: expected uint32");
  fails("ratio", "half", "ratio: expected double");
  fails("force", "yes", "force: expected bool");
  fails("labels", "x", "a map entry is set as labels[key]=value");
  fails("tags[a]", "x", "tags is not a map");
  fails("book", "x", "book: cannot be set from the query string");
  fails("name.x", "y", "name holds no fields");
  fails("raw", "not base64!", "raw: expected bytes");
  EXPECT_EQ(Fill("GET", "/v1/things", {{"raw", "aGk="}}), "raw: \"hi\"");
  // A rule whose body is "*" takes every field from the body.
  EXPECT_EQ(Fill("POST", "/v1/shelves/s/books/b:publish", {{"title", "x"}}),
            "INVALID_ARGUMENT: query parameter title: this method takes its fields in the body");
}

TEST_F(HttpRulesTest, TheBodyIsProto3JsonAndThePathWins) {
  EXPECT_EQ(Fill("POST", "/v1/shelves/s/books/b:publish", {},
                 R"({"name": "shelves/other/books/x", "book": {"pageCount": "12", "genre": "FICTION"},
                     "page_size": 3, "labels": {"k": "v"}, "sizes": [1, "2"], "updateMask": "title,pageCount"})"),
            "name: \"shelves/s/books/b\" labels { key: \"k\" value: \"v\" } page_size: 3 "
            "book { page_count: 12 genre: FICTION } sizes: 1 sizes: 2 "
            "update_mask { paths: \"title\" paths: \"page_count\" }");
  // body: "book": the JSON is that field; the query fills the rest.
  EXPECT_EQ(Fill("POST", "/v1/shelves/s/books", {{"force", "true"}}, R"({"title": "T", "page_count": 9})"),
            "name: \"shelves/s\" force: true book { title: \"T\" page_count: 9 }");
  // body: "raw" (bytes): the body as it is.
  EXPECT_EQ(Fill("PUT", "/v1/shelves/s/raw", {}, std::string("\0{not json", 10)),
            "name: \"shelves/s\" raw: \"\\000{not json\"");

  const auto fails = [&](const std::string& method, const std::string& path, const std::string& body,
                         const std::string& says) {
    const std::string got = Fill(method, path, {}, body);
    EXPECT_TRUE(absl::StartsWith(got, "INVALID_ARGUMENT: ")) << body << ": " << got;
    EXPECT_NE(got.find(says), std::string::npos) << body << ": " << got;
  };
  fails("POST", "/v1/shelves/s/books/b:publish", R"({"colour": 1})", "body: not a JSON Request");
  fails("POST", "/v1/shelves/s/books/b:publish", R"({"genre": "JAZZ"})", "body: not a JSON Request");
  fails("POST", "/v1/shelves/s/books/b:publish", R"({"big": "1e400"})", "body: not a JSON Request");
  fails("POST", "/v1/shelves/s/books/b:publish", "{", "body: not a JSON Request");
  fails("POST", "/v1/shelves/s/books", R"({"name": 5})", "book: not a JSON Book");
  fails("GET", "/v1/things", "{}", "GET /v1/things takes no body");
}

TEST_F(HttpRulesTest, TheApisMethodsGetTheirFormFromTheirShape) {
  absl::StatusOr<HttpRoutes> api =
      HttpRoutes::FromServices({v1::Job::descriptor()->file()->FindServiceByName("JobService"),
                                v1::Dataset::descriptor()->file()->FindServiceByName("DatasetService")});
  ASSERT_TRUE(api.ok()) << api.status();
  int events = 0, bytes = 0, uploads = 0;
  for (const HttpRoute& r : api->routes()) {
    const google::protobuf::MethodDescriptor* m = r.method;
    SCOPED_TRACE(m->full_name());
    EXPECT_EQ(r.answer != HttpAnswer::kJson, m->server_streaming());
    EXPECT_EQ(r.body_stream != nullptr, m->client_streaming());
    if (r.answer == HttpAnswer::kEvents) ++events;
    if (r.answer == HttpAnswer::kBytes) ++bytes;
    if (r.body_stream != nullptr) ++uploads;
  }
  EXPECT_EQ(events, 1);
  EXPECT_EQ(bytes, 1);
  EXPECT_EQ(uploads, 1);

  std::optional<HttpMatch> watch = api->Find("GET", "/v1/projects/p/jobs/j:watch");
  ASSERT_TRUE(watch.has_value());
  EXPECT_EQ(watch->route->answer, HttpAnswer::kEvents);
  EXPECT_EQ(watch->route->resume, v1::WatchJobRequest::descriptor()->FindFieldByName("after_sequence"));

  std::optional<HttpMatch> download = api->Find("GET", "/v1/projects/p/jobs/j/checkpoints/final:download");
  ASSERT_TRUE(download.has_value());
  const HttpByteStream& b = download->route->bytes;
  EXPECT_EQ(download->route->answer, HttpAnswer::kBytes);
  EXPECT_EQ(b.header, v1::DownloadCheckpointResponse::descriptor()->FindFieldByName("archive"));
  EXPECT_EQ(b.data, v1::DownloadCheckpointResponse::descriptor()->FindFieldByName("data"));
  EXPECT_EQ(b.total_bytes, v1::CheckpointArchive::descriptor()->FindFieldByName("total_bytes"));
  EXPECT_EQ(b.root, v1::CheckpointArchive::descriptor()->FindFieldByName("root"));
  EXPECT_EQ(b.request_offset, v1::DownloadCheckpointRequest::descriptor()->FindFieldByName("offset"));
  EXPECT_EQ(b.request_etag, v1::DownloadCheckpointRequest::descriptor()->FindFieldByName("etag"));
  EXPECT_EQ(MediaOf(b), (std::pair<std::string, std::string>{"application/x-tar", ".tar"}));

  std::optional<HttpMatch> upload = api->Find("PUT", "/v1/projects/p/datasets/d");
  ASSERT_TRUE(upload.has_value());
  EXPECT_EQ(upload->route->body_stream, v1::UploadDatasetRequest::descriptor()->FindFieldByName("data"));
  EXPECT_EQ(api->Find("GET", "/v1/projects/p/jobs/j")->route->answer, HttpAnswer::kJson);
}

TEST_F(HttpRulesTest, EventsAreNamedByTheirOneofMemberAndIdentifiedByItsSequence) {
  v1::WatchJobResponse event;
  event.mutable_event()->set_sequence(7);
  HttpEvent e = EventOf(event);
  EXPECT_EQ(e.name, "event");
  EXPECT_EQ(e.id, 7);
  v1::WatchJobResponse snapshot;
  snapshot.mutable_snapshot()->set_last_sequence(3);
  e = EventOf(snapshot);
  EXPECT_EQ(e.name, "snapshot");
  EXPECT_EQ(e.id, 3);
  e = EventOf(v1::Job());  // no oneof set
  EXPECT_EQ(e.name, "message");
  EXPECT_FALSE(e.id.has_value());
  v1::DownloadCheckpointResponse data;
  data.set_data("x");  // a scalar member: named, no id
  e = EventOf(data);
  EXPECT_EQ(e.name, "data");
  EXPECT_FALSE(e.id.has_value());
}

// A service of streams in package `package`, `methods` its methods' text, over Library's
// messages plus the ones here.
std::string Streams(const std::string& package, const std::string& methods) {
  return absl::StrCat("package: \"", package, "\" name: \"", package, ".proto\"", R"pb(
                        syntax: "proto3"
                        dependency: "test/library.proto"
                        message_type {
                          name: "Chunk"
                          oneof_decl { name: "item" }
                          field {
                            name: "head"
                            number: 1
                            type: TYPE_MESSAGE
                            type_name: ".test.Book"
                            label: LABEL_OPTIONAL
                            oneof_index: 0
                          }
                          field { name: "data" number: 2 type: TYPE_BYTES label: LABEL_OPTIONAL oneof_index: 0 }
                        }
                        service { name: "Streams")pb",
                      methods, "}");
}

TEST_F(HttpRulesTest, StreamsWithoutAnHttpFormAreRefusedAtStart) {
  const auto refusal = [&](const std::string& file, const std::string& methods) {
    const google::protobuf::FileDescriptor* f = Build(Streams(file, methods));
    if (f == nullptr) return std::string("did not build");
    absl::StatusOr<HttpRoutes> routes = HttpRoutes::FromServices({f->FindServiceByName("Streams")});
    return routes.ok() ? std::string("accepted") : std::string(routes.status().message());
  };
  // Chunk has the byte-stream shape, but a Book header has no total_bytes/offset/etag.
  EXPECT_EQ(refusal("ta", R"pb(method {
                                 name: "Read"
                                 input_type: ".test.Request"
                                 output_type: ".ta.Chunk"
                                 server_streaming: true
                                 options {
                                   [google.api.http] { get: "/v1/{name=books/*}:read" }
                                 }
                               })pb"),
            "ta.Streams.Read: a byte stream over HTTP must be resumable; it lacks test.Book.total_bytes (int64)");
  EXPECT_EQ(refusal("tb", R"pb(method {
                                 name: "Chat"
                                 input_type: ".test.Request"
                                 output_type: ".test.Book"
                                 client_streaming: true
                                 server_streaming: true
                                 options {
                                   [google.api.http] { post: "/v1/chat" body: "raw" }
                                 }
                               })pb"),
            "tb.Streams.Chat: a bidirectional stream has no HTTP form");
  EXPECT_EQ(refusal("tc", R"pb(method {
                                 name: "Put"
                                 input_type: ".test.Request"
                                 output_type: ".test.Book"
                                 client_streaming: true
                                 options {
                                   [google.api.http] { put: "/v1/put" body: "name" }
                                 }
                               })pb"),
            "tc.Streams.Put: a client stream's rule must name a bytes field as its body");
  EXPECT_EQ(refusal("td", R"pb(method {
                                 name: "Get"
                                 input_type: ".test.Request"
                                 output_type: ".test.Book"
                                 options {
                                   [google.api.http] { get: "/v1/{nothing=*}" }
                                 }
                               })pb"),
            "td.Streams.Get: /v1/{nothing=*}: no field nothing");
  // Any other server stream is a stream of events, whatever its name.
  const google::protobuf::FileDescriptor* f =
      Build(Streams("te", R"pb(method {
                                 name: "Follow"
                                 input_type: ".test.Request"
                                 output_type: ".test.Book"
                                 server_streaming: true
                                 options {
                                   [google.api.http] { get: "/v1/{name=books/*}:follow" }
                                 }
                               })pb"));
  ASSERT_NE(f, nullptr);
  absl::StatusOr<HttpRoutes> routes = HttpRoutes::FromServices({f->FindServiceByName("Streams")});
  ASSERT_TRUE(routes.ok()) << routes.status();
  EXPECT_EQ(routes->routes()[0].answer, HttpAnswer::kEvents);
  EXPECT_EQ(routes->routes()[0].resume, nullptr);
}

}  // namespace
}  // namespace oomb::server
