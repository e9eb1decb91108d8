// Real receivers kubesink's HTTP sink is tested against (tests/http.rs): the CloudEvents Go SDK's
// HTTP protocol binding decodes every request (binary, structured and batched content modes), so
// what kubesink sends is read by code this project did not write. Built once into
// ~/.cache/kubesink by scripts/receivers-build.sh.
module kubesink.dev/tests/receivers

go 1.26.0

require github.com/cloudevents/sdk-go/v2 v2.16.2

require (
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	go.uber.org/zap v1.27.0 // indirect
)
