"""The official OpenAI and Anthropic Python SDKs, pointed at the proxy.

Run by tests/sdk.rs, which starts simulated providers and the proxy and
passes their address in SWITCHYARD_URL. The policy (written by tests/sdk.rs)
adds `x-served-by` with the provider that answered.
"""

import os
import unittest

import anthropic
import openai

URL = os.environ["SWITCHYARD_URL"]
KEY = os.environ["SWITCHYARD_KEY"]


def openai_client(key=KEY):
    return openai.OpenAI(base_url=URL + "/v1", api_key=key, max_retries=0)


def anthropic_client(key=KEY):
    return anthropic.Anthropic(base_url=URL, api_key=key, max_retries=0)


MESSAGES = [{"role": "user", "content": "Hello"}]


class OpenAI(unittest.TestCase):
    def test_plain_call(self):
        completion = openai_client().chat.completions.create(model="chat", messages=MESSAGES)
        self.assertEqual(completion.choices[0].message.content, "hello from oa-main")
        self.assertGreater(completion.usage.total_tokens, 0)

    def test_streamed_call(self):
        stream = openai_client().chat.completions.create(
            model="chat", messages=MESSAGES, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        self.assertEqual(text, "hello from oa-main")

    def test_failover(self):
        raw = openai_client().chat.completions.with_raw_response.create(
            model="flaky-chat", messages=MESSAGES
        )
        self.assertEqual(raw.headers["x-served-by"], "oa-backup")
        self.assertEqual(raw.parse().choices[0].message.content, "hello from oa-backup")

    def test_streamed_failover(self):
        stream = openai_client().chat.completions.create(
            model="flaky-chat", messages=MESSAGES, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        self.assertEqual(text, "hello from oa-backup")

    def test_a_broken_stream_is_an_error_not_an_answer(self):
        stream = openai_client().chat.completions.create(
            model="broken-chat", messages=MESSAGES, stream=True
        )
        with self.assertRaises(openai.APIError):
            for _ in stream:
                pass

    def test_policy_error(self):
        with self.assertRaises(openai.NotFoundError) as caught:
            openai_client().chat.completions.create(model="no-such-model", messages=MESSAGES)
        self.assertEqual(caught.exception.code, "unknown_model")

    def test_an_error_marked_final_is_not_retried(self):
        # The SDK would retry a 503 twice by itself; tests/sdk.rs counts
        # the provider's requests for this model afterwards.
        client = openai.OpenAI(base_url=URL + "/v1", api_key=KEY, max_retries=2)
        with self.assertRaises(openai.InternalServerError) as caught:
            client.chat.completions.create(model="down-chat", messages=MESSAGES)
        self.assertEqual(caught.exception.code, "down")
        self.assertEqual(caught.exception.response.headers["x-should-retry"], "false")

    def test_unknown_key(self):
        with self.assertRaises(openai.AuthenticationError):
            openai_client("sk-wrong").chat.completions.create(model="chat", messages=MESSAGES)

    def test_models(self):
        ids = {model.id for model in openai_client().models.list()}
        self.assertTrue({"chat", "flaky-chat", "claude"} <= ids, ids)
        self.assertEqual(openai_client().models.retrieve("chat").id, "chat")
        with self.assertRaises(openai.NotFoundError):
            openai_client().models.retrieve("no-such-model")

    def test_a_broken_responses_stream_is_an_error_not_an_answer(self):
        stream = openai_client().responses.create(
            model="broken-chat", input="Hello", stream=True
        )
        with self.assertRaises(openai.APIError):
            for _ in stream:
                pass


class Anthropic(unittest.TestCase):
    def test_plain_call(self):
        message = anthropic_client().messages.create(
            model="claude", max_tokens=64, messages=MESSAGES
        )
        self.assertEqual(message.content[0].text, "hello from an-main")
        self.assertGreater(message.usage.output_tokens, 0)
        self.assertTrue(message._request_id, "the request id, where the SDK reads it")

    def test_models(self):
        self.assertEqual(anthropic_client().models.retrieve("claude").id, "claude")
        # Page by page, as the SDK follows `has_more` and `last_id`.
        whole = [model.id for model in anthropic_client().models.list()]
        paged = [model.id for model in anthropic_client().models.list(limit=2)]
        self.assertEqual(paged, whole)
        self.assertGreater(len(whole), 2)
        first = anthropic_client().models.list(limit=2)
        self.assertEqual(len(first.data), 2)
        self.assertTrue(first.has_more)

    def test_streamed_call(self):
        with anthropic_client().messages.stream(
            model="claude", max_tokens=64, messages=MESSAGES
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        self.assertEqual(text, "hello from an-main")
        self.assertEqual(final.stop_reason, "end_turn")

    def test_failover(self):
        raw = anthropic_client().messages.with_raw_response.create(
            model="flaky-claude", max_tokens=64, messages=MESSAGES
        )
        self.assertEqual(raw.headers["x-served-by"], "an-backup")
        self.assertEqual(raw.parse().content[0].text, "hello from an-backup")

    def test_policy_error(self):
        with self.assertRaises(anthropic.NotFoundError) as caught:
            anthropic_client().messages.create(
                model="no-such-model", max_tokens=64, messages=MESSAGES
            )
        self.assertEqual(caught.exception.body["error"]["type"], "not_found_error")
        self.assertTrue(caught.exception.request_id)

    def test_unknown_key(self):
        with self.assertRaises(anthropic.AuthenticationError):
            anthropic_client("sk-wrong").messages.create(
                model="claude", max_tokens=64, messages=MESSAGES
            )


if __name__ == "__main__":
    unittest.main(verbosity=2)
