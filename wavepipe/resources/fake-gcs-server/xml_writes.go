// wavepipe's addition to fake-gcs-server (added to its fakestorage package before it is built):
// the XML API's writes as Google Cloud Storage serves them and Rust's object_store sends them.
//   - PUT /bucket/object: an upload, or a copy (x-goog-copy-source), honouring
//     x-goog-if-generation-match (0: only if absent; N: only over generation N), answering with
//     the new object's ETag and x-goog-generation headers;
//   - multipart uploads: POST ?uploads, PUT ?partNumber=N&uploadId=U, POST ?uploadId=U (the
//     object appears whole, under the same precondition), DELETE ?uploadId=U.
// Upstream v1.56.1 answers an unsigned XML PUT with "invalid uploadType" and ignores the header.

package fakestorage

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"crypto/rand"
	"encoding/hex"

	"github.com/gorilla/mux"
)

type xmlUpload struct {
	mu    sync.Mutex
	parts map[int][]byte
}

var xmlUploads sync.Map

func xmlHasQuery(name string) mux.MatcherFunc {
	return func(r *http.Request, _ *mux.RouteMatch) bool { return r.URL.Query().Has(name) }
}

// xmlWriteRoutes adds the routes above to handler, ahead of the signed-URL ones.
func (s *Server) xmlWriteRoutes(handler *mux.Router) {
	path := "/{bucketName}/{objectName:.+}"
	on := handler.MatcherFunc(s.publicHostMatcher)
	on.Path(path).Methods(http.MethodPost).MatcherFunc(xmlHasQuery("uploads")).HandlerFunc(xmlToHTTPHandler(s.xmlInitiate))
	handler.MatcherFunc(s.publicHostMatcher).Path(path).Methods(http.MethodPut).MatcherFunc(xmlHasQuery("uploadId")).HandlerFunc(jsonToHTTPHandler(s.xmlPart))
	handler.MatcherFunc(s.publicHostMatcher).Path(path).Methods(http.MethodPost).MatcherFunc(xmlHasQuery("uploadId")).HandlerFunc(xmlToHTTPHandler(s.xmlComplete))
	handler.MatcherFunc(s.publicHostMatcher).Path(path).Methods(http.MethodDelete).MatcherFunc(xmlHasQuery("uploadId")).HandlerFunc(jsonToHTTPHandler(s.xmlAbort))
	handler.MatcherFunc(s.publicHostMatcher).Path(path).Methods(http.MethodPut).MatcherFunc(func(r *http.Request, _ *mux.RouteMatch) bool {
		return r.URL.Query().Get("X-Goog-Algorithm") == ""
	}).HandlerFunc(jsonToHTTPHandler(s.xmlPut))
}

func xmlConditions(r *http.Request) (generationCondition, error) {
	found := generationCondition{}
	if text := r.Header.Get("x-goog-if-generation-match"); text != "" {
		gen, err := strconv.ParseInt(text, 10, 64)
		if err != nil {
			return found, err
		}
		found.ifGenerationMatch = &gen
	}
	return found, nil
}

func (s *Server) xmlCreate(r *http.Request, content io.ReadCloser) jsonResponse {
	vars := unescapeMuxVars(mux.Vars(r))
	conditions, err := xmlConditions(r)
	if err != nil {
		return jsonResponse{status: http.StatusBadRequest, errorMessage: err.Error()}
	}
	if _, err := s.backend.GetBucket(vars["bucketName"]); err != nil {
		return jsonResponse{status: http.StatusNotFound}
	}
	obj := StreamingObject{
		ObjectAttrs: ObjectAttrs{BucketName: vars["bucketName"], Name: vars["objectName"], ContentType: r.Header.Get(contentTypeHeader)},
		Content:     notImplementedSeeker{content},
	}
	obj, err = s.createObject(obj, conditions)
	if err != nil {
		return errToJsonResponse(err)
	}
	obj.Close()
	header := http.Header{}
	header.Set("ETag", fmt.Sprintf("%q", obj.Etag))
	header.Set("X-Goog-Generation", strconv.FormatInt(obj.Generation, 10))
	return jsonResponse{header: header, data: newObjectResponse(obj.ObjectAttrs, s.URL())}
}

func (s *Server) xmlPut(r *http.Request) jsonResponse {
	defer r.Body.Close()
	source := r.Header.Get("x-goog-copy-source")
	if source == "" {
		return s.xmlCreate(r, r.Body)
	}
	unescaped, err := url.PathUnescape(strings.TrimPrefix(source, "/"))
	if err != nil {
		return jsonResponse{status: http.StatusBadRequest, errorMessage: err.Error()}
	}
	bucket, name, _ := strings.Cut(unescaped, "/")
	found, err := s.GetObject(bucket, name)
	if err != nil {
		return jsonResponse{status: http.StatusNotFound}
	}
	return s.xmlCreate(r, io.NopCloser(bytes.NewReader(found.Content)))
}

func (s *Server) xmlInitiate(r *http.Request) xmlResponse {
	id := make([]byte, 16)
	rand.Read(id)
	upload := hex.EncodeToString(id)
	xmlUploads.Store(upload, &xmlUpload{parts: map[int][]byte{}})
	body, _ := xml.Marshal(struct {
		XMLName  xml.Name `xml:"InitiateMultipartUploadResult"`
		UploadId string   `xml:"UploadId"`
	}{UploadId: upload})
	return xmlResponse{data: body}
}

func (s *Server) xmlPart(r *http.Request) jsonResponse {
	defer r.Body.Close()
	found, ok := xmlUploads.Load(r.URL.Query().Get("uploadId"))
	number, err := strconv.Atoi(r.URL.Query().Get("partNumber"))
	if !ok || err != nil {
		return jsonResponse{status: http.StatusNotFound, errorMessage: "no such upload or part number"}
	}
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return jsonResponse{status: http.StatusBadRequest, errorMessage: err.Error()}
	}
	upload := found.(*xmlUpload)
	upload.mu.Lock()
	upload.parts[number] = data
	upload.mu.Unlock()
	header := http.Header{}
	header.Set("ETag", fmt.Sprintf("\"part-%d-%d\"", number, len(data)))
	return jsonResponse{header: header}
}

func (s *Server) xmlComplete(r *http.Request) xmlResponse {
	defer r.Body.Close()
	id := r.URL.Query().Get("uploadId")
	found, ok := xmlUploads.Load(id)
	if !ok {
		return xmlResponse{status: http.StatusNotFound, errorMessage: "no such upload"}
	}
	var listed struct {
		Parts []struct {
			PartNumber int `xml:"PartNumber"`
		} `xml:"Part"`
	}
	if err := xml.NewDecoder(r.Body).Decode(&listed); err != nil {
		return xmlResponse{status: http.StatusBadRequest, errorMessage: err.Error()}
	}
	upload := found.(*xmlUpload)
	var whole bytes.Buffer
	upload.mu.Lock()
	for _, part := range listed.Parts {
		whole.Write(upload.parts[part.PartNumber])
	}
	upload.mu.Unlock()
	made := s.xmlCreate(r, io.NopCloser(&whole))
	if status := made.getStatus(); status > 399 {
		return xmlResponse{status: status, errorMessage: made.getErrorMessage(status)}
	}
	xmlUploads.Delete(id)
	body, _ := xml.Marshal(struct {
		XMLName xml.Name `xml:"CompleteMultipartUploadResult"`
		ETag    string   `xml:"ETag"`
	}{ETag: made.header.Get("ETag")})
	return xmlResponse{header: made.header, data: body}
}

func (s *Server) xmlAbort(r *http.Request) jsonResponse {
	xmlUploads.Delete(r.URL.Query().Get("uploadId"))
	return jsonResponse{status: http.StatusNoContent}
}
