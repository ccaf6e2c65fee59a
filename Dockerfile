# Multi-stage build of the single chatpipe binary (every role).
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/chatpipe ./cmd/chatpipe

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/chatpipe /usr/local/bin/chatpipe
# The image's nonroot user, by number so that an orchestrator's
# runAsNonRoot check can verify it without reading /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/chatpipe"]
