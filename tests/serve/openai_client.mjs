// The official `openai` npm client against `turbine serve`.
// usage: node openai_client.mjs PORT API_KEY
// Exits 1 on the first failed check (message on stderr).
import OpenAI from "openai";

const [port, apiKey] = process.argv.slice(2);
const baseURL = `http://127.0.0.1:${port}/v1`;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });

function check(cond, msg) {
  if (!cond) {
    console.error("FAIL: " + msg);
    process.exit(1);
  }
}
const ok = (m) => console.log("ok: " + m);

async function main() {
  const models = await client.models.list();
  const ids = [];
  for await (const m of models) ids.push(m.id);
  check(ids.length === 1, `models.list gave ${JSON.stringify(ids)}`);
  const model = ids[0];
  ok(`models.list: ${model}`);

  const messages = [{ role: "user", content: "Tell me a story about a cat." }];

  // chat, not streamed
  const chat = await client.chat.completions.create({ model, messages, max_tokens: 40, temperature: 0 });
  check(chat.object === "chat.completion", `chat object ${chat.object}`);
  const chatText = chat.choices[0].message.content;
  check(typeof chatText === "string" && chatText.length > 0, "chat content empty");
  check(chat.choices[0].finish_reason === "length", `chat finish ${chat.choices[0].finish_reason}`);
  check(chat.usage && chat.usage.completion_tokens === 40, `chat usage ${JSON.stringify(chat.usage)}`);

  // chat, streamed
  const stream = await client.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let streamed = "", n = 0, role = null, finish = null, usage = null, tokenChunks = 0;
  for await (const chunk of stream) {
    n++;
    if (chunk.usage) usage = chunk.usage;
    if (!chunk.choices.length) continue;
    const c = chunk.choices[0];
    if (n === 1) role = c.delta.role;
    if (c.delta.content) streamed += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
    else if (!c.delta.role) tokenChunks++;
  }
  check(role === "assistant", `first streamed chat delta role ${role}`);
  check(finish === "length", `streamed chat finish ${finish}`);
  check(usage && usage.completion_tokens === 40, `streamed chat usage ${JSON.stringify(usage)}`);
  check(streamed === chatText, `streamed chat ${JSON.stringify(streamed)} != ${JSON.stringify(chatText)}`);
  // one event per generated token, as OpenAI sends them
  check(tokenChunks === 40, `40 chat tokens arrived in ${tokenChunks} chunks`);
  ok(`chat: streamed (${n} chunks: role, 40 tokens, finish, usage) = not streamed: ${JSON.stringify(chatText.slice(0, 40))}`);

  // with log-probabilities: each chunk carries its own token's
  const lpStream = await client.chat.completions.create({
    model, messages, max_tokens: 40, temperature: 0, stream: true, logprobs: true, top_logprobs: 2,
  });
  let lpChunks = 0;
  for await (const chunk of lpStream) {
    const c = chunk.choices[0];
    if (!c || c.finish_reason || c.delta.role) continue;
    lpChunks++;
    check(c.logprobs && c.logprobs.content.length === 1 && c.logprobs.content[0].token === c.delta.content,
          `a chat chunk's logprobs: ${JSON.stringify(c.logprobs)} for ${JSON.stringify(c.delta.content)}`);
  }
  check(lpChunks === 40, `40 chat tokens with logprobs arrived in ${lpChunks} chunks`);
  ok("chat with logprobs: 40 chunks, each with its own token's log-probabilities");

  // completions, not streamed and streamed
  const prompt = "Once upon a time";
  const comp = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0 });
  const compText = comp.choices[0].text;
  check(compText.startsWith(", there was a little girl named Lily"), `completion text ${JSON.stringify(compText)}`);
  check(comp.choices[0].finish_reason === "length", `completion finish ${comp.choices[0].finish_reason}`);
  const cs = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0, stream: true });
  let ctext = "", cfinish = null, cn = 0, ctok = 0;
  for await (const chunk of cs) {
    cn++;
    ctext += chunk.choices[0].text;
    if (chunk.choices[0].finish_reason) cfinish = chunk.choices[0].finish_reason;
    else ctok++;
  }
  check(ctext === compText, `streamed completion ${JSON.stringify(ctext)} != ${JSON.stringify(compText)}`);
  check(cfinish === "length", `streamed completion finish ${cfinish}`);
  check(ctok === 40, `40 completion tokens arrived in ${ctok} chunks`);
  ok(`completions: streamed (${cn} chunks: 40 tokens, finish) = not streamed`);

  // echo: the prompt before the completion
  const echoed = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0, echo: true });
  check(echoed.choices[0].text === prompt + compText, `echo: ${JSON.stringify(echoed.choices[0].text)}`);
  ok("completions with echo");

  // a stop string through the client
  const st = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0, stop: ["girl named"] });
  check(st.choices[0].text === ", there was a little " && st.choices[0].finish_reason === "stop",
        `stop: ${JSON.stringify(st.choices[0])}`);
  ok("completions with a stop string");

  // abort a stream half way (the client's own cancellation)
  const ac = new AbortController();
  const long = await client.completions.create(
    { model, prompt, max_tokens: 300, temperature: 0, stream: true }, { signal: ac.signal });
  let got = 0, aborted = false;
  try {
    for await (const _chunk of long) {
      if (++got === 3) ac.abort();
    }
  } catch (e) {
    aborted = e instanceof OpenAI.APIUserAbortError || e.name === "AbortError";
    if (!aborted) throw e;
  }
  check(aborted || got >= 3, "the stream could not be aborted");
  ok("a stream aborted by the client");

  // errors map to the client's error classes
  try {
    await client.chat.completions.create({ model, messages, max_tokens: 5, temperature: 5 });
    check(false, "temperature 5 was accepted");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.status === 400, `temperature 5: ${e}`);
    check(e.error && typeof e.error.message === "string" && e.error.message.length > 0, `400 error body ${JSON.stringify(e.error)}`);
  }
  try {
    await client.completions.create({ model: "no-such-model", prompt, max_tokens: 5 });
    check(false, "an unknown model was accepted");
  } catch (e) {
    check(e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === "model_not_found", `unknown model: ${e}`);
  }
  try {
    const tools = [{ type: "function", function: { name: "weather", parameters: { type: "object", properties: {} } } }];
    await client.chat.completions.create({ model, messages, max_tokens: 5, tools });
    check(false, "tools were accepted");
  } catch (e) {
    check(e instanceof OpenAI.BadRequestError && e.param === "tools", `tools: ${e}`);
  }
  const bad = new OpenAI({ baseURL, apiKey: apiKey + "x", maxRetries: 0, timeout: 30000 });
  try {
    await bad.completions.create({ model, prompt, max_tokens: 5 });
    check(false, "a wrong API key was accepted");
  } catch (e) {
    check(e instanceof OpenAI.AuthenticationError && e.status === 401, `wrong key: ${e}`);
  }
  ok("errors: BadRequestError (400, also for tools), NotFoundError (unknown model), AuthenticationError (401)");

  // n = 2 choices, streamed through the SDK's accumulating helper: it assembles each choice by index
  const runner = client.chat.completions.stream({ model, messages, max_tokens: 12, temperature: 1.0, seed: 11, n: 2 });
  const final = await runner.finalChatCompletion();
  const plain = await client.chat.completions.create({ model, messages, max_tokens: 12, temperature: 1.0, seed: 11, n: 2 });
  check(final.choices.length === 2 && plain.choices.length === 2, `n=2 gave ${final.choices.length} / ${plain.choices.length} choices`);
  for (let i = 0; i < 2; i++) {
    check(final.choices[i].index === i && final.choices[i].message.role === "assistant", `n=2 choice ${i}: ${JSON.stringify(final.choices[i])}`);
    check(final.choices[i].message.content === plain.choices[i].message.content,
      `n=2 choice ${i}: streamed ${JSON.stringify(final.choices[i].message.content)} != ${JSON.stringify(plain.choices[i].message.content)}`);
  }
  check(plain.usage.completion_tokens > 0 && plain.usage.completion_tokens <= 2 * 12,
    `n=2 usage ${JSON.stringify(plain.usage)}`);
  check(typeof plain.usage.prompt_tokens_details?.cached_tokens === "number", `usage lacks cached_tokens: ${JSON.stringify(plain.usage)}`);
  ok(`n=2: the SDK's stream helper assembles both choices as the plain reply has them`);

  // a list of prompts: one choice each, in order, each the text its prompt gives alone
  const other = "The dog";
  const alone = await client.completions.create({ model, prompt: other, max_tokens: 40, temperature: 0 });
  const batch = await client.completions.create({ model, prompt: [prompt, other], max_tokens: 40, temperature: 0 });
  check(batch.choices.length === 2 && batch.choices[0].index === 0 && batch.choices[1].index === 1,
    `prompt list: ${JSON.stringify(batch.choices)}`);
  check(batch.choices[0].text === compText && batch.choices[1].text === alone.choices[0].text,
    `prompt list texts: ${JSON.stringify(batch.choices.map((c) => c.text))}`);
  check(batch.usage.prompt_tokens === comp.usage.prompt_tokens + alone.usage.prompt_tokens,
    `prompt list usage ${JSON.stringify(batch.usage)}`);
  ok("completions with a list of prompts: one choice each, as each prompt alone");

  // still serving
  const again = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0 });
  check(again.choices[0].text === compText, "after the errors the text changed");
  ok("still serving the same text");
}

main().catch((e) => {
  console.error("FAIL: " + (e && e.stack ? e.stack : e));
  process.exit(1);
});
