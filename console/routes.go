package console

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// route is one API operation: the handler and what the OpenAPI document
// says of it, in one place, so that the document cannot drift from the
// handlers (openapi_test.go checks both ways).
type route struct {
	method string
	// path is an http.ServeMux pattern path, {name} for a path parameter
	// (the same syntax as OpenAPI's).
	path    string
	id      string
	summary string
	// description says more: what it needs, what it refuses.
	description string
	tag         string
	// in is the request: fields tagged path, query, or json (the body).
	// Handlers read it through bind, from the same tags.
	in any
	// out is the response body.
	out any
	// status is the success status.
	status int
	// stream: a Server-Sent Events stream, not JSON.
	stream bool
	handle func(c *call) (any, error)
}

// APIError is the body of every error answer.
type APIError struct {
	Error APIErrorBody `json:"error"`
}

// APIErrorBody says what went wrong and what to do.
type APIErrorBody struct {
	// Code is the HTTP status.
	Code int `json:"code"`
	// Reason is a word for programs: Unauthorized, Forbidden, NotFound,
	// Invalid, Conflict, BadRequest, InternalError, ...
	Reason string `json:"reason"`
	// Message is for people.
	Message string `json:"message"`
}

// httpError is an error with the status to answer it with.
type httpError struct {
	status int
	reason string
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func errorf(status int, reason, format string, args ...any) error {
	return &httpError{status: status, reason: reason, msg: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return errorf(http.StatusBadRequest, "BadRequest", format, args...)
}

func notFound(format string, args ...any) error {
	return errorf(http.StatusNotFound, "NotFound", format, args...)
}

func forbidden(format string, args ...any) error {
	return errorf(http.StatusForbidden, "Forbidden", format, args...)
}

// errorBody maps an error to its answer: the API server's own status and
// message for its errors (a refusal is the API server's, in its words).
func errorBody(err error) APIErrorBody {
	var he *httpError
	if errors.As(err, &he) {
		return APIErrorBody{Code: he.status, Reason: he.reason, Message: he.msg}
	}
	if errors.Is(err, ErrUnauthenticated) {
		return APIErrorBody{Code: http.StatusUnauthorized, Reason: "Unauthorized", Message: err.Error()}
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		code := int(s.Code)
		if code == 0 {
			code = http.StatusInternalServerError
		}
		reason := string(s.Reason)
		if reason == "" {
			reason = http.StatusText(code)
		}
		return APIErrorBody{Code: code, Reason: reason, Message: s.Message}
	}
	return APIErrorBody{Code: http.StatusInternalServerError, Reason: "InternalError", Message: err.Error()}
}

// maxBody bounds request bodies: the largest is a queue or a workload form.
const maxBody = 64 << 10

// bind fills dst (a pointer to a route's in struct) from the request: path
// and query fields from their tags, the rest from the JSON body when the
// struct has json fields and the method carries a body.
func bind(r *http.Request, dst any) error {
	v := reflect.ValueOf(dst).Elem()
	hasBody := false
	if err := bindFields(r, v, &hasBody); err != nil {
		return err
	}
	if !hasBody || r.Method == http.MethodGet || r.Method == http.MethodDelete {
		return nil
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") && !strings.HasPrefix(ct, "application/merge-patch+json") {
		return errorf(http.StatusUnsupportedMediaType, "UnsupportedMediaType", "send the body as JSON (Content-Type: application/json), not %q", ct)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return badRequest("read the body: %v", err)
	}
	if len(body) > maxBody {
		return errorf(http.StatusRequestEntityTooLarge, "RequestEntityTooLarge", "the body is over %d bytes", maxBody)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	// Decoding into the struct itself would clear nothing: path and query
	// fields have no json name and are skipped.
	if err := dec.Decode(dst); err != nil {
		return badRequest("the body is not the JSON this operation takes: %v (see /api/v1/openapi.json)", err)
	}
	return nil
}

func bindFields(r *http.Request, v reflect.Value, hasBody *bool) error {
	t := v.Type()
	for i := range t.NumField() {
		f := t.Field(i)
		fv := v.Field(i)
		if f.Anonymous && f.Type.Kind() == reflect.Struct {
			if err := bindFields(r, fv, hasBody); err != nil {
				return err
			}
			continue
		}
		var raw string
		var present bool
		switch {
		case f.Tag.Get("path") != "":
			raw, present = r.PathValue(f.Tag.Get("path")), true
		case f.Tag.Get("query") != "":
			q := r.URL.Query()
			name := f.Tag.Get("query")
			raw, present = q.Get(name), q.Has(name)
		default:
			if n := f.Tag.Get("json"); n != "" && n != "-" {
				*hasBody = true
			}
			continue
		}
		if !present {
			continue
		}
		if err := setScalar(fv, raw); err != nil {
			name := f.Tag.Get("path") + f.Tag.Get("query")
			return badRequest("parameter %s=%q: %v", name, raw, err)
		}
	}
	return nil
}

func setScalar(v reflect.Value, raw string) error {
	switch v.Kind() {
	case reflect.String:
		v.SetString(raw)
	case reflect.Int, reflect.Int32, reflect.Int64:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return errors.New("want a whole number")
		}
		v.SetInt(n)
	case reflect.Uint, reflect.Uint32, reflect.Uint64:
		n, err := strconv.ParseUint(raw, 10, 64)
		if err != nil {
			return errors.New("want a whole number, 0 or more")
		}
		v.SetUint(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return errors.New("want true or false")
		}
		v.SetBool(b)
	default:
		return fmt.Errorf("unsupported parameter type %s", v.Kind())
	}
	return nil
}
