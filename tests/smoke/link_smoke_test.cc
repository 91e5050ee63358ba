// Link smoke test: gRPC + protobuf (Debian's) and LibTorch (which bundles its own protobuf) in
// one process. The CUDA half is link_smoke_gpu_test.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "grpc/health/v1/health.grpc.pb.h"
#include "oomb/v1/jobs.grpc.pb.h"
#include "tests/smoke/torch_side.h"

namespace oomb {
namespace {

// A JobService whose GetServerInfo computes with LibTorch inside the gRPC handler.
class TorchBackedService final : public v1::JobService::CallbackService {
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx, const v1::GetServerInfoRequest*,
                                          v1::ServerInfo* info) override {
    info->set_torch_version(std::to_string(smoke::TorchMatmulSum()));
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

TEST(LinkSmokeTest, ProtobufRoundTrip) {
  v1::JobSpec spec;
  spec.set_display_name("smoke");
  spec.mutable_memory()->set_chunk_tokens(4096);
  (*spec.mutable_labels())["team"] = "nlp";
  v1::JobSpec back;
  ASSERT_TRUE(back.ParseFromString(spec.SerializeAsString()));
  EXPECT_EQ(back.memory().chunk_tokens(), 4096);
  EXPECT_EQ(back.labels().at("team"), "nlp");
}

TEST(LinkSmokeTest, GrpcServerComputesWithTorch) {
  grpc::EnableDefaultHealthCheckService(true);
  TorchBackedService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(grpc::health::v1::Health::NewStub(channel)->Check(&ctx, {}, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ServerInfo info;
  const grpc::Status s = v1::JobService::NewStub(channel)->GetServerInfo(&ctx, {}, &info);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.torch_version(), std::to_string(83.0));
  server->Shutdown();
}

TEST(LinkSmokeTest, PageGatherCpu) { EXPECT_EQ(smoke::CpuPageGatherError(), ""); }

}  // namespace
}  // namespace oomb
