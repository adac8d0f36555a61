// gateway-standin plays the proxy's side of the Gateway API Inference Extension's endpoint picker protocol
// (docs/proposals/004-endpoint-picker-protocol in kubernetes-sigs/gateway-api-inference-extension, v1.6.0)
// the way an Envoy-based gateway does with its ext_proc filter configured as the Inference Extension's
// guides configure it: request and response headers SEND, request and response bodies FULL_DUPLEX_STREAMED,
// trailers SEND. It exists so that tokenyard's tests can drive the endpoint picker without a gateway; the
// messages on the wire are Envoy's own (go-control-plane's generated types).
//
// Per client request it opens one ExternalProcessor.Process stream, sends the request headers and then the
// body in chunks as they arrive, reads the picked endpoints (the x-gateway-destination-endpoint header and
// the envoy.lb dynamic metadata, which must agree), forwards the request itself to the first endpoint that
// accepts a connection (the rest of the list are the fallbacks), reports the one that served in the
// response's metadata (envoy.lb / x-gateway-destination-endpoint-served), and streams the response headers
// and body through the processor to the client. An ImmediateResponse from the processor is the client's
// answer. When the client goes away, the stream is cancelled, as Envoy resets it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

const (
	lbNamespace        = "envoy.lb"
	destinationKey     = "x-gateway-destination-endpoint"
	servedKey          = "x-gateway-destination-endpoint-served"
	subsetNamespace    = "envoy.lb.subset_hint"
	subsetKey          = "x-gateway-destination-endpoint-subset"
	subsetHeader       = "x-standin-subset"   // test hook: a comma-separated subset hint sent as metadata
	upstreamHeader     = "x-standin-upstream" // test hook: the endpoint that served, on the response
	defaultChunkBytes  = 16 * 1024
	upstreamConnectMax = 2 * time.Second
)

type standin struct {
	client     extprocv3.ExternalProcessorClient
	chunkBytes int
	upstream   *http.Client
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address the stand-in accepts client requests on")
	epp := flag.String("epp", "", "host:port of the endpoint picker's ExternalProcessor service (required)")
	chunk := flag.Int("chunk-bytes", defaultChunkBytes, "request body bytes per ext_proc body message")
	flag.Parse()
	if *epp == "" {
		fmt.Fprintln(os.Stderr, "gateway-standin: error: --epp HOST:PORT is required")
		os.Exit(2)
	}
	if *chunk <= 0 {
		fmt.Fprintf(os.Stderr, "gateway-standin: error: --chunk-bytes %d: must be > 0\n", *chunk)
		os.Exit(2)
	}
	conn, err := grpc.NewClient(*epp, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway-standin: error: --epp %s: %v\n", *epp, err)
		os.Exit(2)
	}
	defer conn.Close()
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway-standin: error: --listen %s: %v\n", *listen, err)
		os.Exit(1)
	}
	transport := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: upstreamConnectMax}).DialContext,
		MaxIdleConnsPerHost: 64,
		DisableCompression:  true,
	}
	s := &standin{client: extprocv3.NewExternalProcessorClient(conn), chunkBytes: *chunk,
		upstream: &http.Client{Transport: transport}}
	server := &http.Server{Handler: http.HandlerFunc(s.serve)}
	// The test reads this line to learn the port (--listen 127.0.0.1:0).
	fmt.Printf("listening on %s\n", listener.Addr())
	os.Stdout.Sync()

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		server.Shutdown(ctx)
	}()
	if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("gateway-standin: %v", err)
	}
}

// headerMap renders HTTP headers as Envoy does: lower-case names, pseudo-headers first, values as raw bytes.
func headerMap(pseudo [][2]string, header http.Header) *corev3.HeaderMap {
	out := &corev3.HeaderMap{}
	for _, kv := range pseudo {
		out.Headers = append(out.Headers, &corev3.HeaderValue{Key: kv[0], RawValue: []byte(kv[1])})
	}
	for name, values := range header {
		for _, value := range values {
			out.Headers = append(out.Headers, &corev3.HeaderValue{Key: strings.ToLower(name), RawValue: []byte(value)})
		}
	}
	return out
}

func applyMutation(header http.Header, mutation *extprocv3.HeaderMutation) {
	if mutation == nil {
		return
	}
	for _, name := range mutation.RemoveHeaders {
		header.Del(name)
	}
	for _, option := range mutation.SetHeaders {
		value := string(option.GetHeader().GetRawValue())
		if value == "" {
			value = option.GetHeader().GetValue()
		}
		if strings.HasPrefix(option.GetHeader().GetKey(), ":") {
			continue // pseudo-headers are the proxy's own
		}
		header.Set(option.GetHeader().GetKey(), value)
	}
}

func lbMetadata(key string, value *structpb.Value) *corev3.Metadata {
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		lbNamespace: {Fields: map[string]*structpb.Value{key: value}},
	}}
}

// pickedEndpoints reads the processor's answer to the request headers: the endpoint list from the header
// mutation and from the dynamic metadata. The protocol forbids two different values.
func pickedEndpoints(response *extprocv3.ProcessingResponse) (string, error) {
	var fromHeader string
	for _, option := range response.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if strings.EqualFold(option.GetHeader().GetKey(), destinationKey) {
			fromHeader = string(option.GetHeader().GetRawValue())
		}
	}
	fromMetadata := response.GetDynamicMetadata().GetFields()[lbNamespace].GetStructValue().GetFields()[destinationKey].GetStringValue()
	if fromHeader == "" || fromMetadata == "" {
		return "", fmt.Errorf("the processor named no endpoint (header %q, metadata %q)", fromHeader, fromMetadata)
	}
	if fromHeader != fromMetadata {
		return "", fmt.Errorf("the processor's header %q and metadata %q name different endpoints", fromHeader, fromMetadata)
	}
	return fromHeader, nil
}

func writeImmediate(w http.ResponseWriter, immediate *extprocv3.ImmediateResponse) {
	for _, option := range immediate.GetHeaders().GetSetHeaders() {
		w.Header().Set(option.GetHeader().GetKey(), string(option.GetHeader().GetRawValue()))
	}
	code := int(immediate.GetStatus().GetCode())
	if code == 0 {
		code = http.StatusInternalServerError
	}
	w.Header().Set("x-standin-immediate", "true")
	w.WriteHeader(code)
	w.Write(immediate.GetBody())
}

func fail(w http.ResponseWriter, code int, format string, args ...any) {
	message := fmt.Sprintf(format, args...)
	log.Printf("gateway-standin: %s", message)
	http.Error(w, "gateway-standin: "+message, code)
}

func (s *standin) serve(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithCancel(r.Context()) // the client going away cancels the ext_proc stream
	defer cancel()
	stream, err := s.client.Process(ctx)
	if err != nil {
		fail(w, http.StatusInternalServerError, "opening the ext_proc stream: %v", err)
		return
	}

	// --- request phase: headers, then the body as it arrives, sent while the answers are read -------------
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap([][2]string{
				{":method", r.Method}, {":path", r.URL.RequestURI()}, {":authority", r.Host}, {":scheme", "http"},
			}, r.Header),
			EndOfStream: r.ContentLength == 0,
		}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{
			RequestBodyMode:  filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
		},
	}
	if subset := r.Header.Get(subsetHeader); subset != "" {
		var members []any
		for _, member := range strings.Split(subset, ",") {
			members = append(members, strings.TrimSpace(member))
		}
		list, _ := structpb.NewList(members)
		first.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			subsetNamespace: {Fields: map[string]*structpb.Value{subsetKey: structpb.NewListValue(list)}},
		}}
	}
	if err := stream.Send(first); err != nil {
		fail(w, http.StatusInternalServerError, "sending request headers: %v", err)
		return
	}
	sendErr := make(chan error, 1)
	if r.ContentLength != 0 {
		go func() {
			err := s.sendBody(stream, r.Body)
			if err != nil {
				cancel() // unblocks the Recv below
			}
			sendErr <- err
		}()
	} else {
		sendErr <- nil
	}

	outHeader := r.Header.Clone()
	outHeader.Del(subsetHeader)
	var endpoints string
	var body []byte
	for bodyDone := r.ContentLength == 0; endpoints == "" || !bodyDone; {
		response, err := stream.Recv()
		if err != nil {
			fail(w, http.StatusInternalServerError, "the processor's stream ended in the request phase: %v", err)
			return
		}
		switch answer := response.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			writeImmediate(w, answer.ImmediateResponse)
			return
		case *extprocv3.ProcessingResponse_RequestHeaders:
			if endpoints, err = pickedEndpoints(response); err != nil {
				fail(w, http.StatusInternalServerError, "%v", err)
				return
			}
			applyMutation(outHeader, answer.RequestHeaders.GetResponse().GetHeaderMutation())
		case *extprocv3.ProcessingResponse_RequestBody:
			if endpoints == "" {
				fail(w, http.StatusInternalServerError, "a body response came before the headers response")
				return
			}
			streamed := answer.RequestBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if streamed == nil {
				fail(w, http.StatusInternalServerError, "FULL_DUPLEX_STREAMED needs a streamed_response body mutation")
				return
			}
			body = append(body, streamed.Body...)
			bodyDone = streamed.EndOfStream
		default:
			fail(w, http.StatusInternalServerError, "unexpected answer in the request phase: %T", answer)
			return
		}
	}
	if err := <-sendErr; err != nil {
		fail(w, http.StatusBadRequest, "reading the client's body: %v", err)
		return
	}

	// --- upstream: the first endpoint that takes a connection; the others are fallbacks --------------------
	var upstream *http.Response
	served := ""
	for _, endpoint := range strings.Split(endpoints, ",") {
		endpoint = strings.TrimSpace(endpoint)
		request, err := http.NewRequestWithContext(ctx, r.Method, "http://"+endpoint+r.URL.RequestURI(), strings.NewReader(string(body)))
		if err != nil {
			continue
		}
		request.Header = outHeader.Clone()
		request.Header.Del(destinationKey)
		request.Header.Del("Content-Length")
		request.ContentLength = int64(len(body))
		upstream, err = s.upstream.Do(request)
		if err == nil {
			served = endpoint
			break
		}
		log.Printf("gateway-standin: endpoint %s failed: %v", endpoint, err)
	}
	status, responseHeader := 0, http.Header{}
	var upstreamBody io.Reader
	if upstream == nil {
		// What Envoy does when no endpoint takes the request: a local 503, which still passes the encoder
		// filters (the processor sees it, with no endpoint served).
		status = http.StatusServiceUnavailable
		responseHeader.Set("Content-Type", "text/plain")
		upstreamBody = strings.NewReader("upstream connect error: no endpoint of " + endpoints + " accepted the request")
	} else {
		defer upstream.Body.Close()
		status, responseHeader, upstreamBody = upstream.StatusCode, upstream.Header.Clone(), upstream.Body
	}

	// --- response phase: headers, then the body chunks as they arrive, each answered before it is relayed ---
	headersMessage := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap([][2]string{{":status", strconv.Itoa(status)}}, responseHeader),
		}},
	}
	if served != "" {
		headersMessage.MetadataContext = lbMetadata(servedKey, structpb.NewStringValue(served))
	}
	if err := stream.Send(headersMessage); err != nil {
		fail(w, http.StatusBadGateway, "sending response headers: %v", err)
		return
	}
	go func() {
		err := s.sendResponseBody(stream, upstreamBody)
		if err != nil {
			cancel() // a broken upstream resets the stream, as Envoy does
		}
		sendErr <- err
	}()
	wroteHeader := false
	flusher, _ := w.(http.Flusher)
	for {
		response, err := stream.Recv()
		if err != nil {
			if !wroteHeader {
				fail(w, http.StatusBadGateway, "the processor's stream ended in the response phase: %v", err)
				return
			}
			panic(http.ErrAbortHandler) // the status line is out: the client sees the stream cut
		}
		switch answer := response.Response.(type) {
		case *extprocv3.ProcessingResponse_ImmediateResponse:
			if !wroteHeader {
				writeImmediate(w, answer.ImmediateResponse)
				return
			}
			panic(http.ErrAbortHandler)
		case *extprocv3.ProcessingResponse_ResponseHeaders:
			for name, values := range responseHeader {
				if strings.EqualFold(name, "Content-Length") {
					continue // the processor may change the body: Envoy drops it in this mode
				}
				w.Header()[name] = values
			}
			applyMutation(w.Header(), answer.ResponseHeaders.GetResponse().GetHeaderMutation())
			if served != "" {
				w.Header().Set(upstreamHeader, served) // test hook: where the request really went
			}
			w.WriteHeader(status)
			wroteHeader = true
			if flusher != nil {
				flusher.Flush()
			}
		case *extprocv3.ProcessingResponse_ResponseBody:
			streamed := answer.ResponseBody.GetResponse().GetBodyMutation().GetStreamedResponse()
			if streamed == nil || !wroteHeader {
				panic(http.ErrAbortHandler)
			}
			if len(streamed.Body) > 0 {
				if _, err := w.Write(streamed.Body); err != nil {
					return // the client is gone: the deferred cancel resets the stream
				}
				if flusher != nil {
					flusher.Flush()
				}
			}
			if streamed.EndOfStream {
				if err := <-sendErr; err != nil {
					log.Printf("gateway-standin: upstream body: %v", err)
				}
				stream.CloseSend()
				return
			}
		case *extprocv3.ProcessingResponse_ResponseTrailers:
		default:
			panic(http.ErrAbortHandler)
		}
	}
}

func (s *standin) sendBody(stream extprocv3.ExternalProcessor_ProcessClient, body io.Reader) error {
	buffer := make([]byte, s.chunkBytes)
	for {
		n, err := io.ReadFull(body, buffer)
		last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !last {
			return err
		}
		message := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: append([]byte(nil), buffer[:n]...), EndOfStream: last},
		}}
		if err := stream.Send(message); err != nil {
			return err
		}
		if last {
			return nil
		}
	}
}

// sendResponseBody passes each read of the upstream body as it arrives (an event stream's chunks), then an
// empty last chunk with end_of_stream. A broken upstream read cancels the exchange: Envoy resets the stream.
func (s *standin) sendResponseBody(stream extprocv3.ExternalProcessor_ProcessClient, body io.Reader) error {
	buffer := make([]byte, 64*1024)
	for {
		n, err := body.Read(buffer)
		if n > 0 {
			message := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{Body: append([]byte(nil), buffer[:n]...)},
			}}
			if sendErr := stream.Send(message); sendErr != nil {
				return sendErr
			}
		}
		if errors.Is(err, io.EOF) {
			return stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
				ResponseBody: &extprocv3.HttpBody{EndOfStream: true},
			}})
		}
		if err != nil {
			return err
		}
	}
}
