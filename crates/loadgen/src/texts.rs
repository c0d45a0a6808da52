//! Text material of the synthetic workload: long shared system prompts, user questions about
//! images, follow-ups and assistant answers. Fixed strings, so a seed fully determines a workload.

use std::fmt::Write;

/// Long system prompts shared by many conversations (several hundred tokens each), as deployed
/// assistants have: the shared prefix a cache-aware router should keep on few workers.
pub(crate) const SYSTEM_PROMPTS: &[&str] = &[
    "You are ShopLens, the visual support assistant of an online electronics and home-goods retailer. \
Customers send photos of products they bought, received, or want to buy, and ask questions about them. \
Your job is to look carefully at every image, describe only what is actually visible, and help the \
customer reach a concrete next step.\n\n\
Guidelines:\n\
1. Start by identifying the product category, the brand and model if a label or logo is legible, and the \
condition of the item (new, used, damaged, incomplete). Never guess a serial number or model number that \
you cannot read in the photo; ask the customer for a closer picture instead.\n\
2. If the customer reports damage, describe the damage precisely: where it is, how large it is relative \
to the item, and whether it looks like shipping damage (crushed corners, punctures in the box, broken \
seals) or wear from use (scratches along edges, discoloration, worn buttons).\n\
3. For returns and exchanges, remind the customer that items can be returned within 30 days of delivery \
in their original packaging, that opened software and personal-care items cannot be returned, and that \
damaged-on-arrival claims must be filed within 7 days with at least two photos.\n\
4. For compatibility questions (cables, chargers, mounts, filters, spare parts), compare the connectors, \
dimensions and markings visible in the photo with the product the customer names. Say clearly when the \
photo is not enough to decide.\n\
5. Keep answers short: a two-sentence summary first, then at most five bullet points. Use metric units \
first and imperial units in parentheses. Do not recommend competitors' stores.\n\
6. Never ask for payment details, passwords or full addresses. If the photo shows personal data (a \
shipping label, a receipt with a card number), tell the customer you will ignore it and suggest cropping \
it out next time.\n\
7. If the image is blurry, too dark, or does not show the product, say so politely and explain how to \
take a better photo: good light, the whole item in frame, the label in focus.\n\
Always answer in the language the customer writes in.",
    "You are DocSight, an assistant that reads photographed and scanned business documents: receipts, \
invoices, delivery notes, forms, whiteboards and handwritten notes. Users upload one or more images and \
ask you to extract, check or summarise their content.\n\n\
How to work:\n\
- Read the whole image before answering. Documents are often rotated, folded, partially cut off or \
photographed at an angle; mention it when it affects what you can read.\n\
- When extracting fields, return them as a compact list in the form `field: value`. Standard fields for \
receipts are merchant, date, time, currency, subtotal, tax, tip, total and payment method; for invoices \
add invoice number, due date, seller and buyer tax ids, and line items with quantity, unit price and \
amount.\n\
- Never invent a value. If a field is missing or illegible, write `field: unreadable` or `field: absent`. \
Check that line items add up to the subtotal and that subtotal plus tax equals the total; report any \
mismatch with the numbers involved.\n\
- Dates must be normalised to ISO 8601 (YYYY-MM-DD). Amounts keep the document's currency and use a dot \
as the decimal separator. Keep the original spelling of names.\n\
- For handwritten notes and whiteboards, transcribe faithfully, keep the line structure, and mark \
uncertain words with [?]. Diagrams should be described in one or two sentences.\n\
- If several images are sent together, treat them as pages of one document unless their content shows \
otherwise, and say which page each extracted value comes from.\n\
- Redact full card numbers, bank account numbers and national identity numbers: show only the last four \
digits.\n\
Be precise and terse. Do not add commentary unless asked.",
    "You are FieldNotes, an assistant for outdoor and travel photography. People share photos from hikes, \
city walks, gardens, wildlife outings and trips, and ask what they are looking at, where it might have \
been taken, or how to take a better picture next time.\n\n\
When you answer:\n\
* Describe the scene in the order a viewer would notice it: the main subject, then the setting, then \
notable details in the background. Mention the light (time of day, direction, weather) when it is \
visible.\n\
* When identifying plants, animals, landmarks or vehicles, give your best identification with a \
confidence (high, medium, low) and the visual features it rests on. Offer at most two alternatives. \
Never claim certainty about a species from a distant or blurry subject.\n\
* Do not try to identify people. You may describe clothing, activity and group size.\n\
* If asked where a photo was taken, reason from visible clues only: signs, architecture, vegetation, \
road markings, the position of the sun. Say when the clues are not enough.\n\
* Photography advice must be concrete: composition (rule of thirds, leading lines, foreground interest), \
exposure (shutter speed, aperture, ISO ranges for the situation), focus and stabilisation. Tailor it to a \
phone camera unless the user mentions other gear.\n\
* Safety first: if a photo shows a risky situation (unstable ground, approaching wildlife, a storm front), \
point it out briefly.\n\
Keep a friendly, curious tone and answers under 150 words unless the user asks for more detail.",
];

/// Questions whose exact text several conversations share (same text, different images).
pub(crate) const COMMON_QUESTIONS: &[&str] = &[
    "What is in this picture? Describe it in detail.",
    "Is anything wrong or damaged in this photo?",
    "Extract all the text you can read from this image.",
];

/// First-turn questions; a conversation-specific detail is appended to make the text unique.
pub(crate) const QUESTIONS: &[&str] = &[
    "I just received this and I'm not sure it's the right model. Can you tell what it is from the photo?",
    "Can you describe what you see here and tell me whether it looks new or used?",
    "Please read this and list every amount with its label.",
    "Where do you think this picture was taken? Explain what gives it away.",
    "Compare these images and tell me what changed between them.",
    "The package arrived like this. Does it look like shipping damage to you?",
    "How could I have taken a better photo of this? Be specific about the settings.",
    "What kind of plant or animal is this, and how confident are you?",
    "Summarise what this document says in three bullet points.",
    "Does the connector in this photo fit a standard USB-C charger?",
];

/// Details appended to first-turn questions so that conversations differ in text.
pub(crate) const DETAILS: &[&str] = &[
    "I ordered it last Tuesday",
    "this was on my kitchen table this morning",
    "my colleague sent me this",
    "it's for a report due on Friday",
    "the light was pretty bad when I took it",
    "I'm travelling next week and need to know",
    "the seller says it's brand new",
    "this is the second time I ask about it",
];

/// Later-turn user messages.
pub(crate) const FOLLOW_UPS: &[&str] = &[
    "Thanks. Can you look again at the left part of the first image and tell me more?",
    "What would you recommend I do next?",
    "Could you put that in a table instead?",
    "Are you sure? Look at the top right corner once more.",
    "Give me a shorter version I can paste into an email.",
    "What else should I check before I decide?",
    "Explain the second point in more detail, please.",
    "Does anything in the background change your answer?",
];

/// Sentences from which assistant answers are assembled.
pub(crate) const ANSWER_SENTENCES: &[&str] = &[
    "The image shows the item from slightly above, in warm indoor light.",
    "The label in the lower part of the photo is partly legible.",
    "There is a visible scratch along the right edge, about two centimetres long.",
    "Nothing in the picture suggests damage from shipping.",
    "The background contains a wooden surface and a white wall.",
    "I can read the total amount, but the date is cut off at the top.",
    "The colours look accurate, although the highlights are slightly overexposed.",
    "Based on the shape and the markings, this is most likely the standard model.",
    "I would suggest taking another photo with the label in focus.",
    "The second image shows the same object from the opposite side.",
    "The numbers on the document add up correctly.",
    "This looks consistent with normal wear from everyday use.",
    "The light comes from the left, which suggests a late-afternoon window.",
    "If you need a definite answer, a close-up of the connector would help.",
];

/// Words of the generated prose (`prose`), separated by white space: everyday English plus the vocabulary
/// of the assistants above, so the text tokenizes like real prompts (about 1.3 tokens per word with
/// numbers and punctuation).
const WORDS: &str =
    "the of and to a in is that it was for on are as with they at be this from have or by one had not but \
what all were when we there can an your which their said if do will each about how up out them then she \
many some so these would other into has more her two like him see time could no make than first been its \
who now people my made over did down only way find use may water long little very after words called \
just where most know get through back much before go good new write our used me man too any day same \
right look think also around another came come work three word must because does part even place well \
such here take why things help put years different away again off went old number great tell men say \
small every found still between name should home big give air line set own under read last never us left \
end along while might next sound below saw something thought both few those always looked show large \
often together asked house don't world going want school important until form food keep children feet \
land side without once life enough took sometimes four head above kind began almost live page got earth \
need far hand high year mother light parts country father let night following picture being study second \
soon story since white days ever paper hard near sentence better best across during today others sure \
means knew it's try told young miles sun ways thing whole hear example heard several change answer room \
against top turned learn point city play toward five using usually money customer invoice receipt \
package shipping damage label photo camera window battery charger connector screen warranty refund \
exchange delivery order product model serial manual cable report meeting schedule project budget \
deadline summary document table chart garden mountain river forest weather morning evening travel \
station museum kitchen recipe flour butter oven minutes temperature server request latency throughput \
database query function variable compile error version release";

/// Prose of about `tokens` Qwen/Llama-3 tokens drawn from `rng`: sentences of random words with the
/// occasional number and paragraph break. Each call gives new text (nothing a cache has seen).
pub(crate) fn prose(rng: &mut impl rand::Rng, tokens: usize) -> String {
    // Measured on the Qwen tokenizer (the loadgen test `unique_text_has_about_the_asked_tokens_and_never_repeats`).
    const TOKENS_PER_WORD: f64 = 1.3;
    let vocabulary: Vec<&str> = WORDS.split_ascii_whitespace().collect();
    let words = ((tokens as f64 / TOKENS_PER_WORD).round() as usize).max(1);
    let mut out = String::with_capacity(words * 7);
    let (mut in_sentence, mut sentences) = (0usize, 0usize);
    let mut sentence_len = rng.random_range(6..=20);
    let mut number = String::new();
    for _ in 0..words {
        if in_sentence > 0 {
            out.push(' ');
        }
        let word = if rng.random_ratio(1, 25) {
            number.clear();
            write!(number, "{}", rng.random_range(2..=9999u32)).expect("writing to a String");
            number.as_str()
        } else {
            vocabulary[rng.random_range(0..vocabulary.len())]
        };
        let mut chars = word.chars();
        if let (0, Some(first)) = (in_sentence, chars.next()) {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        } else {
            out.push_str(word);
        }
        in_sentence += 1;
        if in_sentence == sentence_len {
            out.push('.');
            (in_sentence, sentence_len) = (0, rng.random_range(6..=20));
            sentences += 1;
            out.push_str(if sentences % 5 == 0 { "\n\n" } else { " " });
        } else if rng.random_ratio(1, 12) {
            out.push(',');
        }
    }
    let trimmed = out.trim_end().len();
    out.truncate(trimmed);
    if in_sentence > 0 {
        out.push('.');
    }
    out
}
